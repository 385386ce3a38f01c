"""A transaction that inserted an outbox row and stays open must not stall dispatch.

It holds the idle flag's lock shared until it ends, so no enqueuer can take the
flag and no commit NOTIFYs. The enqueuer must keep claiming committed rows
anyway: whether the transaction was already open when it started, or opened
while it was busy draining a backlog. The poll is an hour away, so a stall
shows as rows never published; the tests assert which rows are published while
the transaction is open (every committed one, not its own), never how fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.redis_client import RedisClient
from dispatcher.stream import queue_streams
from tests.data import insert_rows
from tests.enqueuers import make_enqueuer, running
from tests.outbox_rows import INSERT_ONE, flat_payload
from tests.waiting import eventually

POLL_FAR_AWAY = 3600.0  # seconds: only the claims that keep coming can publish meanwhile


async def published(client: RedisClient, queue: str) -> set[str]:
    out: set[str] = set()
    for stream in queue_streams([queue], 4):
        for _entry_id, fields in await client.xrange(stream):
            out.add(fields["outbox_id"])
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


async def each_published_while_held(
    held: psycopg.AsyncConnection[Any], *, db_url: str, client: RedisClient, queue: str
) -> None:
    """Commit 12 rows one by one, each published before the next, ``held`` open throughout;
    then its commit, and its row published."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for i in range(12):
            row_id = f"s-{i}"
            await conn.execute(
                INSERT_ONE,
                {
                    "id": row_id,
                    "stream": f"workflow.tasks.{queue}.1",
                    "payload": flat_payload(row_id),
                    "retries": 5,
                },
            )
            await eventually(lambda r=row_id: _has(client, queue, r), within=30)
    assert "held" not in await published(client, queue)
    await held.commit()
    await eventually(lambda: _has(client, queue, "held"), within=30)


async def test_open_transaction_already_there_at_start(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    async with held_insert(outbox_db_url, queue) as held:
        enqueuer = make_enqueuer(
            pool, redis_standalone, listen=outbox_db_url, poll_interval=POLL_FAR_AWAY
        )
        async with running(enqueuer):
            await each_published_while_held(
                held, db_url=outbox_db_url, client=redis_standalone, queue=queue
            )
    assert len(await published(redis_standalone, queue)) == 13


async def test_open_transaction_opened_while_draining(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    insert_rows(outbox_db_url, 3000, queue=queue, prefix="backlog-")
    enqueuer = make_enqueuer(
        pool, redis_standalone, listen=outbox_db_url, poll_interval=POLL_FAR_AWAY
    )
    async with running(enqueuer):
        await eventually(lambda: _more_than(redis_standalone, queue, 100))
        async with held_insert(outbox_db_url, queue) as held:
            await eventually(lambda: _more_than(redis_standalone, queue, 2999), within=60)
            await each_published_while_held(
                held, db_url=outbox_db_url, client=redis_standalone, queue=queue
            )
    assert len(await published(redis_standalone, queue)) == 3013


async def _has(client: RedisClient, queue: str, row_id: str) -> bool:
    return row_id in await published(client, queue)


async def _more_than(client: RedisClient, queue: str, n: int) -> bool:
    return len(await published(client, queue)) > n
