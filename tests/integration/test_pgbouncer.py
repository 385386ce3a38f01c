"""The enqueuer behind a real PgBouncer: refused in one line where it cannot work, fast otherwise.

Transaction pooling cannot carry LISTEN or the idle flag (session state), so the
enqueuer refuses it at start instead of silently degrading to the poll. Session
pooling keeps both, and dispatch stays NOTIFY-driven.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatcher.outbox.pooler import session_pooling
from dispatcher.redis_client import RedisClient
from tests.data import insert_rows
from tests.enqueuers import spawn_enqueuer
from tests.fix_pgbouncer import PgBouncerProcess
from tests.outbox_rows import outbox_status, published
from tests.waiting import eventually


def run_enqueuer(db_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            *("-m", "dispatcher.cli", "enqueuer"),
            *("--database-url", db_url, "--redis-url", redis_url),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_probe_tells_session_state_that_sticks_from_state_that_does_not(
    outbox_db_url: str, pgbouncer: Callable[..., PgBouncerProcess]
) -> None:
    assert await session_pooling(outbox_db_url) == "session"
    assert await session_pooling(pgbouncer("session").url(outbox_db_url)) == "session"
    assert await session_pooling(pgbouncer("transaction").url(outbox_db_url)) == "transaction"
    assert await session_pooling(pgbouncer("statement").url(outbox_db_url)) == "statement"


@pytest.mark.parametrize("ignore", ["extra_float_digits", "options"])
def test_transaction_pooling_is_refused_in_one_line_naming_the_mode(
    outbox_db_url: str, redis_url: str, pgbouncer: Callable[..., PgBouncerProcess], ignore: str
) -> None:
    bouncer = pgbouncer("transaction", ignore)
    done = run_enqueuer(bouncer.url(outbox_db_url), redis_url)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "transaction pooling" in lines[0]
    assert "pool_mode = transaction" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_refused_session_option_says_what_to_change(
    outbox_db_url: str, redis_url: str, pgbouncer: Callable[..., PgBouncerProcess]
) -> None:
    done = run_enqueuer(pgbouncer("session").url(outbox_db_url), redis_url)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "ignore_startup_parameters" in lines[0]
    assert "cannot reach" not in lines[0]


async def test_behind_a_session_pool_dispatch_is_woken_by_notify(
    outbox_db_url: str,
    redis_url: str,
    redis_standalone: RedisClient,
    queue: str,
    tmp_path: Path,
    pgbouncer: Callable[..., PgBouncerProcess],
) -> None:
    bouncer = pgbouncer("session", "options")
    # The poll is an hour away: only a notification can bring the second row out.
    proc = spawn_enqueuer(
        bouncer.url(outbox_db_url), redis_url, tmp_path / "enqueuer.log", "--poll-interval", "3600"
    )
    try:
        insert_rows(outbox_db_url, 1, queue=queue, prefix="first-")
        await eventually(lambda: _published(redis_standalone, queue, 1), within=60)
        insert_rows(outbox_db_url, 1, queue=queue, prefix="second-")
        await eventually(lambda: _published(redis_standalone, queue, 2), within=60)
    finally:
        proc.terminate()
        proc.wait(60)
    assert outbox_status(outbox_db_url) == {}
    log = (tmp_path / "enqueuer.log").read_text()
    assert "does not exist" not in log, log  # no prepared-statement errors through the pool


async def _published(client: RedisClient, queue: str, n: int) -> bool:
    return len(await published(client, queue)) >= n
