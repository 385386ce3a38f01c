"""Against a server that accepts and never answers, every command ends, saying so in one line.

A ``silent`` server (a loopback socket that accepts connections and never writes a byte)
stands for PostgreSQL or Redis behind a blackholed network. Each ``dispatcher`` command runs
against it as a process, the other server being the suite's real one: it must exit non-zero
with one line naming the server within about one connect timeout (10 s), not hang or retry
for minutes. The enqueuer and the worker wait for their backends by design: each try of
their start-up must fail within the connect timeout and say it will try again.

The bound below is a hang detector (one connect timeout and a half, plus a process start on
a busy machine), not a performance figure: a client that retried the round trip, as
redis-py does by default, takes four timeouts.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.config import CONNECT_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
BOUND = CONNECT_TIMEOUT * 1.5 + 5


@pytest.fixture
def silent() -> Iterator[int]:
    """A loopback port that accepts every connection and never answers; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in (*held, listener):
            conn.close()


def _run(argv: list[str], *, env: dict[str, str]) -> tuple[int | None, float, str]:
    """The command's exit code (None: stopped at the bound), seconds taken, what it printed."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", *argv],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=BOUND)
        return proc.returncode, time.monotonic() - started, out
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, time.monotonic() - started, out


REDIS_COMMANDS = [
    ["limits"],
    ["limits", "set", "--queue", "q", "--max-in-flight", "2"],
    ["shards"],
    ["shards", "set", "2", "--no-wait"],
    ["status"],
    ["dlq", "list", "--queue", "q"],
    ["dlq", "replay", "--queue", "q", "--all"],
]
POSTGRES_COMMANDS = [
    ["status"],
    ["dlq", "list"],
    ["dlq", "replay", "--all"],
    ["cancel", "--run", "r"],
    ["migrate"],
]


@pytest.mark.parametrize("argv", REDIS_COMMANDS, ids=" ".join)
def test_a_command_against_a_silent_redis_ends_in_one_line(
    argv: list[str], silent: int, outbox_db_url: str
) -> None:
    env = {"REDIS_URL": f"redis://127.0.0.1:{silent}/0", "DATABASE_URL": outbox_db_url}
    code, took, out = _run(argv, env=env)
    assert code not in (None, 0), f"{argv}: {code} after {took:.1f} s: {out[-2000:]}"
    (line,) = out.strip().splitlines()
    assert "Redis" in line, line
    print(f"{' '.join(argv)}: exit {code} after {took:.1f} s: {line}")


@pytest.mark.parametrize("argv", POSTGRES_COMMANDS, ids=" ".join)
def test_a_command_against_a_silent_postgres_ends_in_one_line(
    argv: list[str], silent: int, redis_url: str
) -> None:
    # No connect_timeout in the URL: the command's own bound is what is tested.
    env = {"DATABASE_URL": f"postgresql://app@127.0.0.1:{silent}/app", "REDIS_URL": redis_url}
    code, took, out = _run(argv, env=env)
    assert code not in (None, 0), f"{argv}: {code} after {took:.1f} s: {out[-2000:]}"
    (line,) = out.strip().splitlines()
    assert "PostgreSQL" in line, line
    print(f"{' '.join(argv)}: exit {code} after {took:.1f} s: {line}")


@pytest.mark.parametrize(
    ("argv", "silent_one"),
    [
        (["enqueuer", "--no-listen"], "redis"),
        (["enqueuer", "--no-listen"], "postgres"),
        (["worker", "--queue", "q", "--handler", "tests.handlers:record"], "redis"),
    ],
    ids=["enqueuer-redis", "enqueuer-postgres", "worker-redis"],
)
def test_a_start_up_against_a_silent_server_says_it_tries_again(
    argv: list[str], silent_one: str, silent: int, outbox_db_url: str, redis_url: str
) -> None:
    env = {"DATABASE_URL": outbox_db_url, "REDIS_URL": redis_url, "METRICS_PORT": "0"}
    if silent_one == "redis":
        env["REDIS_URL"] = f"redis://127.0.0.1:{silent}/0"
    else:
        env["DATABASE_URL"] = f"postgresql://app@127.0.0.1:{silent}/app"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", *argv],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while time.monotonic() - started < BOUND:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "trying again" in line:
                break
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert lines, "printed nothing"
    assert "trying again" in lines[-1], "".join(lines)[-2000:]
    assert took < BOUND, f"the first try took {took:.1f} s"
    print(f"{' '.join(argv)} ({silent_one} silent): first try failed after {took:.1f} s")
