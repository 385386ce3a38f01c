"""A newcomer who forgot ``dispatcher migrate``: named in one line, before any Redis write.

The enqueuer checks the schema at start: missing or older than the code, it says
``dispatcher migrate`` and exits 2 without touching Redis; newer (a rolling
upgrade, the new code's migrations already applied), it warns once and runs.
``enqueue_dispatch`` on a database without the outbox names the command too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from dispatcher.models import TaskDispatch
from dispatcher.outbox import enqueue_dispatch, enqueue_dispatch_async
from dispatcher.outbox.schema import OutboxMissing, available_migrations
from dispatcher.stream.naming import SHARDS_KEY
from tests.enqueuers import spawn_enqueuer
from tests.fix_db import migrate_url
from tests.waiting import eventually_sync

LATEST = available_migrations()[-1].version


def enqueuer(db_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "dispatcher.cli", "enqueuer"),
            *("--database-url", db_url, "--redis-url", redis_url),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def shard_key(redis_url: str) -> object:
    client = redis.Redis.from_url(redis_url)
    try:
        return client.get(SHARDS_KEY)
    finally:
        client.close()


def test_an_enqueuer_without_the_schema_names_migrate_and_writes_nothing_to_redis(
    empty_db_url: str, redis_url: str
) -> None:
    out = enqueuer(empty_db_url, redis_url)

    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "dispatcher enqueuer: the outbox schema is missing in this database: "
        "run `dispatcher migrate` first"
    ]
    assert shard_key(redis_url) is None


def test_an_enqueuer_on_an_older_schema_names_migrate(empty_db_url: str, redis_url: str) -> None:
    migrate_url(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM outbox_schema_version WHERE version = %s", (LATEST,))

    out = enqueuer(empty_db_url, redis_url)

    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"dispatcher enqueuer: the outbox schema is at version {LATEST - 1}, this code needs "
        f"{LATEST}: run `dispatcher migrate` first"
    ]
    assert shard_key(redis_url) is None


def test_an_enqueuer_on_a_newer_schema_warns_once_and_runs(
    empty_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    migrate_url(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_schema_version (version, name) VALUES (%s, 'future')",
            (LATEST + 1,),
        )
    log = tmp_path / "enqueuer.log"
    proc = spawn_enqueuer(empty_db_url, redis_url, log, "--metrics-port", "0")
    try:
        eventually_sync(lambda: shard_key(redis_url) is not None, within=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    warnings = [line for line in log.read_text().splitlines() if "schema" in line]
    assert len(warnings) == 1, log.read_text()
    assert "WARNING" in warnings[0]
    assert (
        f"outbox schema is at version {LATEST + 1}, newer than this code's {LATEST}"
        in (warnings[0])
    )


def dispatch() -> TaskDispatch:
    return TaskDispatch.model_validate(
        {
            "task_id": "t1",
            "run_id": "r1",
            "workflow_id": "wf",
            "workflow_version": 1,
            "node_id": "n",
            "node_type": "http",
            "queue": "q",
            "attempt": 1,
            "input": "{}",
        }
    )


MISSING = "the outbox table is missing in this database: run `dispatcher migrate` first"


def test_enqueue_dispatch_without_the_schema_names_migrate(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url) as conn:
        with pytest.raises(OutboxMissing) as caught:
            enqueue_dispatch(conn, dispatch())
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    assert str(caught.value) == MISSING
    assert isinstance(caught.value, psycopg.errors.UndefinedTable)
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)


async def test_enqueue_dispatch_async_without_the_schema_names_migrate(empty_db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_db_url) as conn:
        with pytest.raises(OutboxMissing) as caught:
            await enqueue_dispatch_async(conn, dispatch())
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    assert str(caught.value) == MISSING
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)
