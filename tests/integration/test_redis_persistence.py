"""Redis without AOF loses the streams on a restart: the enqueuer and workers say so at start.

Without ``appendonly yes`` they log an ERROR naming the risk; with
``--require-aof`` they refuse to start (exit 2, one line); with AOF on they say
nothing. ``dispatcher status`` reports persistence either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.stream import SHARDS_KEY
from tests.waiting import eventually_sync

ROOT = Path(__file__).resolve().parents[2]
WORKER = ("worker", "--queue", "q", "--handler", "tests.handlers:slow")
NO_AOF = "Redis runs without AOF"


@pytest.fixture
def plain_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis as the suite runs them: ``appendonly no``."""
    server = RedisProcess(tmp_path / "plain")
    try:
        yield server.start()
    finally:
        server.kill()


def dispatcher(
    redis: RedisProcess, *args: str, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", *args, "--redis-url", redis.url],
            cwd=ROOT,
            env={**_environ(), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "REQUIRE_AOF"}


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_worker_on_redis_without_aof_logs_an_error_naming_the_risk(
    plain_redis: RedisProcess, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = dispatcher(plain_redis, *WORKER, log=log)
    try:
        line = eventually_sync(
            lambda: next((x for x in log.read_text().splitlines() if NO_AOF in x), None),
            within=30,
            what="the worker's ERROR about AOF",
        )
    finally:
        stop(worker)
    assert "ERROR" in line
    assert "appendonly yes" in line
    assert "lost" in line


def test_an_enqueuer_on_redis_with_aof_says_nothing_about_it(
    outbox_db_url: str, aof_redis: RedisProcess, tmp_path: Path
) -> None:
    log = tmp_path / "enqueuer.log"
    client = sync_redis.Redis(port=aof_redis.port)
    enqueuer = dispatcher(aof_redis, "enqueuer", "--database-url", outbox_db_url, log=log)
    try:
        # The shard count is written after the start-up checks.
        eventually_sync(lambda: client.exists(SHARDS_KEY), within=30, what="the shard count")
    finally:
        stop(enqueuer)
        client.close()
    assert "AOF" not in log.read_text()
    assert "ERROR" not in log.read_text()


def test_an_enqueuer_on_redis_without_aof_logs_the_error_and_runs(
    outbox_db_url: str, plain_redis: RedisProcess, tmp_path: Path
) -> None:
    log = tmp_path / "enqueuer.log"
    client = sync_redis.Redis(port=plain_redis.port)
    enqueuer = dispatcher(plain_redis, "enqueuer", "--database-url", outbox_db_url, log=log)
    try:
        eventually_sync(lambda: client.exists(SHARDS_KEY), within=30, what="the shard count")
        assert enqueuer.poll() is None  # still running
    finally:
        stop(enqueuer)
        client.close()
    (line,) = [x for x in log.read_text().splitlines() if NO_AOF in x]
    assert "ERROR" in line


@pytest.mark.parametrize(
    ("role", "how"),
    [("worker", "flag"), ("worker", "env"), ("enqueuer", "flag"), ("enqueuer", "env")],
)
def test_require_aof_refuses_to_start_in_one_line(
    outbox_db_url: str, plain_redis: RedisProcess, tmp_path: Path, role: str, how: str
) -> None:
    log = tmp_path / f"{role}.log"
    args = WORKER if role == "worker" else ("enqueuer", "--database-url", outbox_db_url)
    flag = ("--require-aof",) if how == "flag" else ()
    env = {"REQUIRE_AOF": "1"} if how == "env" else None
    proc = dispatcher(plain_redis, *args, *flag, log=log, env=env)
    try:
        assert proc.wait(timeout=60) == 2, log.read_text()
    finally:
        stop(proc)
    lines = log.read_text().strip().splitlines()
    assert lines[-1].startswith(f"dispatcher {role}: "), lines
    assert "appendonly yes" in lines[-1]
    assert "--require-aof" in lines[-1]
    assert "Traceback" not in log.read_text()


def test_require_aof_starts_on_redis_with_aof(aof_redis: RedisProcess, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    client = sync_redis.Redis(port=aof_redis.port)
    worker = dispatcher(aof_redis, *WORKER, "--require-aof", log=log)
    try:
        # The worker creates its consumer groups once past the start-up checks.
        eventually_sync(
            lambda: worker.poll() is None and client.keys("workflow.tasks.q*"),
            within=30,
            what="the worker's streams",
        )
    finally:
        stop(worker)
        client.close()
    assert "AOF" not in log.read_text()


@pytest.mark.parametrize(("server", "aof"), [("plain_redis", False), ("aof_redis", True)])
def test_status_shows_persistence(
    outbox_db_url: str, server: str, aof: bool, request: pytest.FixtureRequest
) -> None:
    redis: RedisProcess = request.getfixturevalue(server)
    base = [sys.executable, "-m", "dispatcher.cli", "status", "--database-url", outbox_db_url]
    base += ["--redis-url", redis.url]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60, check=True).stdout
    as_json = subprocess.run(
        [*base, "--json"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert json.loads(as_json)["redis_aof"] is aof
    (line,) = [x for x in text.splitlines() if x.startswith("redis persistence:")]
    assert ("aof on" if aof else "aof off") in line
