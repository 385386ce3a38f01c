"""The enqueuer as tests run it: on the test's event loop, or as its own process.

``make_enqueuer`` builds the real ``OutboxEnqueuer`` from a pool and a Redis
client; ``running(enqueuer)`` runs it until the block ends, then stops it
gracefully. ``spawn_enqueuer`` starts ``dispatcher enqueuer`` as a process (for
kill, stop and term tests) and ``metric`` sums a sample from its /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository
from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamPublisher
from dispatcher.stream.naming import WORKER_GROUP


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
        publisher=RedisStreamPublisher(client, group=WORKER_GROUP),
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
        [
            sys.executable,
            *("-m", "dispatcher.cli", "enqueuer"),
            *("--database-url", db_url, "--redis-url", redis_url),
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def metric(port: int, name: str) -> float:
    """Sum of a Prometheus metric's samples from a process's /metrics (0 if absent)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )
