"""One row that cannot be encoded fails alone: its batch-mates publish, it is dead-lettered."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.redis_client import RedisClient
from dispatcher.stream import queue_streams
from tests.enqueuers import make_enqueuer, running
from tests.fix_db import charged
from tests.outbox_rows import INSERT_ONE, dead_letters, flat_payload
from tests.waiting import eventually

# Deeper than Python's recursion limit: json.loads raises RecursionError on it.
DEEP = 3000


def deep_payload(task_id: str) -> str:
    return f'{{"task_id": "{task_id}", "input": {"[" * DEEP}{"]" * DEEP}}}'


async def entry_times(client: RedisClient, queue: str) -> dict[str, list[int]]:
    """outbox_id -> the millisecond stamps of its entries (the Redis clock at XADD)."""
    out: dict[str, list[int]] = {}
    for stream in queue_streams([queue], 4):
        for entry_id, fields in await client.xrange(stream):
            out.setdefault(fields["outbox_id"], []).append(int(str(entry_id).split("-")[0]))
    return out


async def test_a_row_that_cannot_be_encoded_fails_alone(
    audited: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    db_url = audited
    stream = f"workflow.tasks.{queue}.0"
    bad = f"bad-{uuid.uuid4().hex[:6]}"
    committed: dict[str, float] = {}
    enqueuer = make_enqueuer(
        pool, redis_standalone, listen=db_url, maintenance_interval=1.0, poll_interval=1.0
    )
    async with running(enqueuer), await psycopg.AsyncConnection.connect(db_url) as conn:
        await eventually(lambda: enqueuer.ready())
        for i in range(20):  # 20 healthy rows over 2 s; the bad one among the first
            if i == 2:
                await conn.execute(
                    INSERT_ONE,
                    {"id": bad, "stream": stream, "payload": deep_payload(bad), "retries": 1},
                )
            row_id = f"ok-{i}"
            await conn.execute(
                INSERT_ONE,
                {"id": row_id, "stream": stream, "payload": flat_payload(row_id), "retries": 5},
            )
            await conn.commit()
            committed[row_id] = time.time()
            await asyncio.sleep(0.1)

        async def settled() -> bool:
            times = await entry_times(redis_standalone, queue)
            return all(r in times for r in committed) and bad in dead_letters(db_url)

        await eventually(settled, within=60)
    times = await entry_times(redis_standalone, queue)
    late = {
        r: round(times[r][0] - committed[r] * 1000)
        for r in committed
        if times[r][0] - committed[r] * 1000 > 1000
    }
    assert late == {}, "healthy rows published more than 1 s after their commit (ms)"
    assert all(len(times[r]) == 1 for r in committed), "published once each"
    assert bad not in times
    dead = dead_letters(db_url)
    assert list(dead) == [bad]
    attempts, error = dead[bad]
    assert attempts == 2, "its retry, then the DLQ"
    assert "RecursionError" in error, error
    assert charged(db_url) == {bad}, "no healthy row had an attempt counted"
