"""A transaction that inserted an outbox row and stays open must not stall dispatch.

It holds the idle flag's lock shared until it ends, so no enqueuer can take the
flag and no commit NOTIFYs. The enqueuer must keep claiming committed rows
anyway: whether the transaction was already open when it started, or opened
while it was busy draining a backlog. The poll is set far away (5 s) so a
stall shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher._testing.data import insert_rows
from dispatcher._testing.waiting import eventually
from dispatcher.redis_client import RedisClient
from dispatcher.stream import queue_streams
from tests.enqueuers import make_enqueuer, running
from tests.outbox_rows import INSERT_ONE, flat_payload


async def entry_ms(client: RedisClient, queue: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for stream in queue_streams([queue], 4):
        for entry_id, fields in await client.xrange(stream):
            out[fields["outbox_id"]] = int(str(entry_id).split("-")[0])
    return out


@contextlib.asynccontextmanager
async def held_insert(db_url: str, queue: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A session whose transaction inserted an outbox row and is left open (closed after)."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.execute(
            INSERT_ONE,
            {"id": "held", "stream": f"workflow.tasks.{queue}.0", "payload": "{}", "retries": 5},
        )
        yield conn


async def latencies_then_commit(
    held: psycopg.AsyncConnection[Any], *, db_url: str, client: RedisClient, queue: str
) -> list[float]:
    """Sparse latencies while ``held`` stays open; then its commit, and its row published."""
    delays = await sparse_latencies(db_url, client, queue)
    await held.commit()
    await eventually(lambda: _has(client, queue, "held"), within=30)
    return delays


async def sparse_latencies(db_url: str, client: RedisClient, queue: str) -> list[float]:
    """Commit 12 rows 0.5 s apart; their commit -> XADD delays in ms."""
    committed: dict[str, float] = {}
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for i in range(12):
            row_id = f"s-{i}"
            payload = flat_payload(row_id)
            stream = f"workflow.tasks.{queue}.1"
            await conn.execute(
                INSERT_ONE, {"id": row_id, "stream": stream, "payload": payload, "retries": 5}
            )
            committed[row_id] = time.time() * 1000
            await asyncio.sleep(0.5)

    async def all_there() -> bool:
        return set(committed) <= set(await entry_ms(client, queue))

    await eventually(all_there, within=60)
    seen = await entry_ms(client, queue)
    return [seen[r] - committed[r] for r in committed]


async def test_open_transaction_already_there_at_start(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    async with held_insert(outbox_db_url, queue) as held:
        enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=5)
        async with running(enqueuer):
            delays = await latencies_then_commit(
                held, db_url=outbox_db_url, client=redis_standalone, queue=queue
            )
    assert statistics.median(delays) < 100, sorted(delays)


async def test_open_transaction_opened_while_draining(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    insert_rows(outbox_db_url, 3000, queue=queue, prefix="backlog-")
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=5)
    async with running(enqueuer):
        await eventually(lambda: _more_than(redis_standalone, queue, 100))
        async with held_insert(outbox_db_url, queue) as held:
            await eventually(lambda: _more_than(redis_standalone, queue, 2999), within=60)
            delays = await latencies_then_commit(
                held, db_url=outbox_db_url, client=redis_standalone, queue=queue
            )
    assert statistics.median(delays) < 100, sorted(delays)


async def _has(client: RedisClient, queue: str, row_id: str) -> bool:
    return row_id in await entry_ms(client, queue)


async def _more_than(client: RedisClient, queue: str, n: int) -> bool:
    return len(await entry_ms(client, queue)) > n
