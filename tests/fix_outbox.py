"""Outbox test helpers: bulk rows, an in-process enqueuer, and reading what was published."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository
from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamPublisher, queue_streams


def outbox_status(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall()
    return {status: int(count) for status, count in rows}


async def published(client: RedisClient, queue: str, shards: int = 4) -> list[dict[str, str]]:
    """Every entry on every shard stream of ``queue`` (with ``_stream`` added)."""
    out: list[dict[str, str]] = []
    for stream in queue_streams([queue], shards):
        for _id, fields in await client.xrange(stream):
            out.append({**fields, "_stream": stream})
    return out


def make_enqueuer(
    pool: AsyncConnectionPool[Any],
    client: RedisClient,
    *,
    listen: str | None = None,
    registry: CollectorRegistry | None = None,
    **config: Any,
) -> OutboxEnqueuer:
    return OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=RedisStreamPublisher(client, group="workers"),
        config=EnqueuerConfig(**config),
        listen_conninfo=listen,
        registry=registry,
    )


@contextlib.asynccontextmanager
async def running(enqueuer: OutboxEnqueuer) -> AsyncIterator[OutboxEnqueuer]:
    """Run the enqueuer in the background for the block; stop it gracefully after."""
    task = asyncio.create_task(enqueuer.run())
    try:
        yield enqueuer
    finally:
        enqueuer.request_stop()
        await asyncio.wait_for(task, 30)


def spawn_enqueuer(
    db_url: str, redis_url: str, log_path: Path, *flags: str
) -> subprocess.Popen[bytes]:
    """``dispatcher enqueuer`` in its own process (for kill/stop/term tests)."""
    log = log_path.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "enqueuer",
         "--database-url", db_url, "--redis-url", redis_url, *flags],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def metric(port: int, name: str) -> float:
    """Sum of a Prometheus metric's samples from a process's /metrics (0 if absent)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


INSERT_ONE = """
INSERT INTO outbox (id, task_id, stream, payload, type, max_retries, backoff_seconds)
VALUES (%(id)s, %(id)s, %(stream)s, %(payload)s::jsonb, 'TASK_EXECUTION', %(retries)s, 1)
"""

# Every change of a row's attempt count, so a test can tell who was charged an attempt.
ATTEMPT_AUDIT = """
CREATE TABLE IF NOT EXISTS test_attempts (id TEXT, attempt INT);
TRUNCATE test_attempts;
CREATE OR REPLACE FUNCTION test_audit_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_attempts VALUES (NEW.id, NEW.attempt_count);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS test_audit_attempt ON outbox;
CREATE TRIGGER test_audit_attempt AFTER UPDATE OF attempt_count ON outbox FOR EACH ROW
    WHEN (NEW.attempt_count IS DISTINCT FROM OLD.attempt_count)
    EXECUTE FUNCTION test_audit_attempt();
"""


@pytest.fixture
def audited(outbox_db_url: str) -> Iterator[str]:
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(ATTEMPT_AUDIT)
    yield outbox_db_url
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER IF EXISTS test_audit_attempt ON outbox")


def charged(db_url: str) -> set[str]:
    with psycopg.connect(db_url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM test_attempts").fetchall()}


def dead_letters(db_url: str) -> dict[str, tuple[int, str]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT id, attempts, last_error FROM outbox_dlq").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def flat_payload(task_id: str) -> str:
    return json.dumps({"task_id": task_id, "input": "{}"})
