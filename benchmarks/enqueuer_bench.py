"""Enqueuer figures: commit -> stream latency at idle, and the drain of pre-filled rows.

Each figure runs for the product (pipelined ``publish_many``) and the per-row
relay baseline in the same process, against the same servers.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from benchmarks.baselines import PerRowPublisher
from benchmarks.env import BenchEnv
from dispatcher.models import TaskDispatch
from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository, enqueue_dispatch
from dispatcher.redis_client import connect_redis
from dispatcher.stream import RedisStreamPublisher, task_stream
from tests.fix_outbox import insert_rows

PUBLISHERS: dict[str, Callable[..., RedisStreamPublisher]] = {
    "pipelined": RedisStreamPublisher,
    "per-row": PerRowPublisher,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _with_enqueuer(env: BenchEnv, variant: str, listen: bool, body: Any) -> Any:
    redis = connect_redis(env.redis_url)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        env.db_url, min_size=6, max_size=6, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    enqueuer = OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=PUBLISHERS[variant](redis, group="workers"),
        config=EnqueuerConfig(maintenance_interval=3600),
        listen_conninfo=env.db_url if listen else None,
    )
    task = asyncio.create_task(enqueuer.run())
    try:
        return await body(enqueuer, redis)
    finally:
        enqueuer.request_stop()
        await task
        await pool.close()
        await redis.aclose()


async def idle_latency(env: BenchEnv, variant: str, samples: int = 200) -> dict[str, float]:
    """Commit one dispatch at a time on an idle system; time until its entry is in Redis."""

    async def body(enqueuer: OutboxEnqueuer, redis: Any) -> dict[str, float]:
        while not (enqueuer.listener and enqueuer.listener.connected):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        queue = f"lat{uuid.uuid4().hex[:6]}"
        stream = task_stream(queue, 0)
        latencies: list[float] = []
        last_id = "$"
        for i in range(samples):
            reader = asyncio.create_task(redis.xread({stream: last_id}, block=5000, count=1))
            await asyncio.sleep(0.02)  # idle gap; the reader is blocked before the commit
            with psycopg.connect(env.db_url) as sync_conn:
                enqueue_dispatch(sync_conn, _dispatch(f"t{i}", queue), shards=1)
                sync_conn.commit()
                committed = time.perf_counter()
            reply = await reader
            latencies.append((time.perf_counter() - committed) * 1000)
            last_id = reply[0][1][-1][0]
        return {
            "p50_ms": statistics.median(latencies),
            "p99_ms": percentile(latencies, 99),
        }

    result: dict[str, float] = await _with_enqueuer(env, variant, True, body)
    return result


async def drain(env: BenchEnv, variant: str, rows: int = 50_000) -> dict[str, float]:
    """Pre-fill ``rows`` due rows, then time the enqueuer (default settings) emptying the outbox."""
    queue = f"dr{uuid.uuid4().hex[:6]}"
    insert_rows(env.db_url, rows, queue=queue, prefix=f"{queue}-")

    async def body(enqueuer: OutboxEnqueuer, redis: Any) -> dict[str, float]:
        started = time.perf_counter()
        async with await psycopg.AsyncConnection.connect(env.db_url, autocommit=True) as conn:
            while True:
                row = await (await conn.execute("SELECT count(*) FROM outbox")).fetchone()
                if row and row[0] == 0:
                    break
                await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        assert sum([await redis.xlen(task_stream(queue, s)) for s in range(4)]) == rows
        return {"rows_per_s": rows / elapsed}

    result: dict[str, float] = await _with_enqueuer(env, variant, False, body)
    return result


def _dispatch(task_id: str, queue: str) -> TaskDispatch:
    return TaskDispatch(
        task_id=task_id, run_id="r", workflow_id="wf", workflow_version=1, node_id="n",
        node_type="t", queue=queue, attempt=1, input='{"x": 1}',
    )  # fmt: skip
