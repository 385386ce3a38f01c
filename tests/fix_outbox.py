"""Outbox test helpers: bulk rows, an in-process enqueuer, and reading what was published."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository
from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamPublisher, queue_streams

# Payloads shaped like enqueue_dispatch's, built in SQL so 10k rows take milliseconds.
BULK_INSERT = """
INSERT INTO outbox (id, task_id, stream, payload, type, max_retries, backoff_seconds)
SELECT %(prefix)s || g, %(prefix)s || g,
       'workflow.tasks.' || %(queue)s || '.' || (g %% %(shards)s),
       jsonb_build_object('task_id', %(prefix)s || g, 'run_id', 'r', 'workflow_id', 'wf',
                          'workflow_version', 1, 'node_id', 'n', 'node_type', 't',
                          'attempt', 1, 'input', '{}'),
       'TASK_EXECUTION', %(max_retries)s, %(backoff)s
  FROM generate_series(1, %(n)s) AS g
"""


def insert_rows(
    url: str,
    n: int,
    *,
    queue: str,
    shards: int = 4,
    prefix: str = "row-",
    max_retries: int = 5,
    backoff: int = 5,
) -> list[str]:
    """Insert ``n`` due rows in one transaction; return their ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            BULK_INSERT,
            {"prefix": prefix, "queue": queue, "shards": shards, "n": n,
             "max_retries": max_retries, "backoff": backoff},
        )  # fmt: skip
    return [f"{prefix}{i}" for i in range(1, n + 1)]


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
    **config: Any,
) -> OutboxEnqueuer:
    return OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=RedisStreamPublisher(client, group="workers"),
        config=EnqueuerConfig(**config),
        listen_conninfo=listen,
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
