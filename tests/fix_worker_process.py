"""Worker processes for the tests: ``spawn(*flags)`` starts ``dispatcher worker``, ``log`` reads
what its handlers recorded (``tests.handlers`` push to the list ``LOG_KEY``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

__all__ = ["LOG_KEY", "WorkerProcess"]

ROOT = Path(__file__).resolve().parents[1]  # the repository: where `tests.handlers` imports from
LOG_KEY = "handler-log"


class WorkerProcess:
    """One ``python -m dispatcher.cli worker`` with its stderr in a file."""

    def __init__(self, redis_url: str, tmp: Path, *flags: str) -> None:
        self.stderr_path = tmp / f"worker-{len(list(tmp.glob('worker-*')))}.log"
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "HANDLER_REDIS_URL": redis_url,
            "HANDLER_LOG_KEY": LOG_KEY,
        }
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dispatcher.cli", "worker", *flags],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def spawn(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn(*flags)``: a worker process on ``redis_url``, killed at teardown in any case."""
    started: list[WorkerProcess] = []

    def start(*flags: str) -> WorkerProcess:
        started.append(WorkerProcess(redis_url, tmp_path, *flags))
        return started[-1]

    yield start
    for p in started:
        p.kill()


@pytest.fixture
def log(redis_url: str) -> Iterator[sync_redis.Redis]:
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
