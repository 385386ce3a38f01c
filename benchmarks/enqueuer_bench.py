"""Enqueuer figures: commit -> stream latency at idle, and the drain of pre-filled rows.

Each figure runs for the product (pipelined ``publish_many``) and the per-row
relay baseline in the same process, against the same servers.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import workload
from benchmarks.baselines import PerRowPublisher, per_row_relay, spec_cycle, spec_schema_url
from benchmarks.env import BenchEnv
from benchmarks.workload import cpu_seconds
from dispatcher.models import TaskDispatch
from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository, enqueue_dispatch
from dispatcher.outbox.repository import enqueuer_pool
from dispatcher.redis_client import connect_redis
from dispatcher.stream import RedisStreamPublisher, publish_shard_count, task_stream
from dispatcher.stream.naming import WORKER_GROUP

PUBLISHERS: dict[str, Callable[..., RedisStreamPublisher]] = {
    "pipelined": RedisStreamPublisher,
    "per-row": PerRowPublisher,
}


def prefill(url: str, rows: int, *, queue: str, size: int = workload.SMALL) -> None:
    """``rows`` due rows of realistic ~0.5 KB payloads (or ``size``) in a fresh table;
    ``TINY`` rows as this harness made them before: one INSERT, so one created_at."""
    step = 0 if size == workload.TINY else workload.STEP_US
    workload.prefill(url, rows, queue=queue, size=size, step_us=step)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _with_enqueuer(env: BenchEnv, variant: str, listen: bool, body: Any) -> Any:
    redis = connect_redis(env.redis_url)
    pool = enqueuer_pool(env.db_url, max_size=6)
    await pool.open(wait=True)
    enqueuer = OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=PUBLISHERS[variant](redis, group=WORKER_GROUP),
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


async def idle_latency(
    env: BenchEnv, variant: str, samples: int = 200, size: int = workload.SMALL
) -> dict[str, float]:
    """Commit one dispatch at a time on an idle system; time until its entry is in Redis."""

    async def body(enqueuer: OutboxEnqueuer, redis: Any) -> dict[str, float]:
        while not (enqueuer.listener and enqueuer.listener.connected):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        queue = f"lat{uuid.uuid4().hex[:6]}"
        await publish_shard_count(redis, 1)  # every entry on shard 0, where the reader waits
        stream = task_stream(queue, 0)
        latencies: list[float] = []
        last_id = "$"
        for i in range(samples):
            reader = asyncio.create_task(redis.xread({stream: last_id}, block=5000, count=1))
            await asyncio.sleep(0.02)  # idle gap; the reader is blocked before the commit
            with psycopg.connect(env.db_url) as sync_conn:
                enqueue_dispatch(sync_conn, workload.sized_dispatch(f"t{i}", queue, size))
                sync_conn.commit()
                committed = time.perf_counter()
            reply = await reader
            if not reply:
                raise RuntimeError("a dispatch did not reach Redis within 5 s")
            latencies.append((time.perf_counter() - committed) * 1000)
            last_id = reply[0][1][-1][0]
        return {
            "p50_ms": statistics.median(latencies),
            "p99_ms": percentile(latencies, 99),
        }

    result: dict[str, float] = await _with_enqueuer(env, variant, True, body)
    return result


async def drain(
    env: BenchEnv, variant: str, rows: int = 50_000, size: int = workload.SMALL
) -> dict[str, float]:
    """Pre-fill ``rows`` due rows, then time the enqueuer (default settings) emptying the outbox."""
    queue = f"dr{uuid.uuid4().hex[:6]}"
    prefill(env.db_url, rows, queue=queue, size=size)

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
    return workload.dispatch(task_id, queue)


async def notify_round_trip(env: BenchEnv, samples: int = 200) -> dict[str, float]:
    """The floor: commit a bare NOTIFY, time until a LISTENing session receives it."""
    latencies: list[float] = []
    async with await psycopg.AsyncConnection.connect(env.db_url, autocommit=True) as listener:
        await listener.execute("LISTEN bench_rtt")
        gen = listener.notifies()
        with psycopg.connect(env.db_url, autocommit=True) as sender:
            for _ in range(samples):
                waiting = asyncio.ensure_future(anext(gen))
                await asyncio.sleep(0.02)
                sender.execute("NOTIFY bench_rtt")
                committed = time.perf_counter()
                await waiting
                latencies.append((time.perf_counter() - committed) * 1000)
        await gen.aclose()  # an open notifies() generator blocks the connection's close
    return {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99)}


def _paced_inserts(db_url: str, queue: str, rate: float, seconds: float) -> dict[str, float]:
    """Commit one dispatch per transaction at ``rate``/s; return commit wall times by id."""
    committed: dict[str, float] = {}
    interval = 1.0 / rate
    with psycopg.connect(db_url, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            target = start + i * interval
            pause = target - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            outbox_id = enqueue_dispatch(conn, _dispatch(f"p{i}", queue))
            committed[outbox_id] = time.time()
    return committed


async def latency_under_load(env: BenchEnv, variant: str, rate: float = 1000.0) -> dict[str, float]:
    """Commit -> stream at ``rate`` rows/s offered (Redis entry ids give the publish time, 1 ms)."""
    queue = f"ld{uuid.uuid4().hex[:6]}"

    async def body(enqueuer: OutboxEnqueuer, redis: Any) -> dict[str, float]:
        while not (enqueuer.listener and enqueuer.listener.connected):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        committed = await asyncio.to_thread(_paced_inserts, env.db_url, queue, rate, 5.0)
        await asyncio.sleep(0.5)
        latencies = []
        for shard in range(4):
            for entry_id, fields in await redis.xrange(task_stream(queue, shard)):
                stored_ms = int(entry_id.split("-")[0])
                latencies.append(stored_ms - committed[fields["outbox_id"]] * 1000)
        return {
            "offered_rows_per_s": len(committed) / 5.0,
            "p50_ms": statistics.median(latencies),
            "p99_ms": percentile(latencies, 99),
        }

    result: dict[str, float] = await _with_enqueuer(env, variant, True, body)
    return result


async def sql_only_cycle(env: BenchEnv, schema: str, rows: int = 50_000) -> dict[str, float]:
    """The spec design's claim -> delete with no Redis at all: batch 50, 4 connections.

    ``schema`` "spec" runs it on the spec design's own table and indexes; "ours" on
    the project's table (fewer indexes, so the spec's statements run faster on it).
    """
    url = spec_schema_url(env.db_url) if schema == "spec" else env.db_url
    prefill(url, rows, queue="sqlonly")
    return {"rows_per_s": await spec_cycle(url, rows, publish=None)}


async def spec_relay(env: BenchEnv, rows: int = 50_000) -> dict[str, float]:
    """The straightforward relay: spec claim, one awaited XADD per row, DELETE (4 loops)."""
    url = spec_schema_url(env.db_url)
    queue = f"sr{uuid.uuid4().hex[:6]}"
    prefill(url, rows, queue=queue)
    publish, close = per_row_relay(env.redis_url)
    try:
        return {"rows_per_s": await spec_cycle(url, rows, publish=publish)}
    finally:
        await close()


def _spawn_enqueuers(env: BenchEnv, processes: int) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "dispatcher.cli", "enqueuer", "--no-listen",
               "--database-url", env.db_url, "--redis-url", env.redis_url]  # fmt: skip
    return [
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(processes)
    ]


def _cores_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall: float
) -> dict[str, float]:
    used: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        used[name] = used.get(name, 0.0) + (cpu - before.get(pid, (name, 0.0))[1]) / wall
    return used


async def drain_processes(env: BenchEnv, processes: int, rows: int = 50_000) -> dict[str, float]:
    """``processes`` real ``dispatcher enqueuer`` processes drain ``rows`` pre-filled rows.

    Also reports the cores each side kept busy during the drain (from /proc: the enqueuer
    processes, every postgres process, every redis-server), to show where the limit is.
    """
    queue = f"mp{uuid.uuid4().hex[:6]}"
    prefill(env.db_url, rows, queue=queue)
    procs = _spawn_enqueuers(env, processes)
    watched = {"postgres", "redis-server", "python", "python3", "dispatcher"}
    try:
        # The clock starts at the first published batch, so process start-up does not count.
        started, base, cpu_before = 0.0, rows, {}
        async with await psycopg.AsyncConnection.connect(env.db_url, autocommit=True) as conn:
            while True:
                row = await (await conn.execute("SELECT count(*) FROM outbox")).fetchone()
                left = int(row[0]) if row else 0
                if not started and left < rows:
                    started, base, cpu_before = (
                        time.perf_counter(),
                        left,
                        cpu_seconds(watched),
                    )
                if left == 0:
                    break
                await asyncio.sleep(0.02)
        wall = time.perf_counter() - started
        after = cpu_seconds(watched)
        cores = _cores_used(cpu_before, after, wall)
        mine = {p.pid: after[p.pid] for p in procs if p.pid in after}
        return {
            "cores_enqueuers": sum(_cores_used(cpu_before, mine, wall).values()),
            "cores_postgres": cores.get("postgres", 0.0),
            "cores_redis": cores.get("redis-server", 0.0),
            "rows_per_s": base / wall,
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
