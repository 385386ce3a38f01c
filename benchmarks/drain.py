"""Drain of a pre-filled outbox: the enqueuer process against the SQL-only cycle and a relay.

Per variant a fresh outbox holds ``rows`` due rows of one payload size
(``workload.prefill``); then

- ``enqueuer``: ``dispatcher enqueuer`` with its defaults, as its own process;
- ``relay``: the pipelined reference relay (``benchmarks.baselines``), its own
  process, at the enqueuer's default batch size and connection count;
- ``sql_only``: the spec design's claim -> delete (UPDATE ... IN_FLIGHT, then
  DELETE) on the spec's own table, no Redis at all, same batch size and
  connections: the most a relay built on that design could drain.

The clock starts when the first entry reaches Redis (process start-up does not
count: ``startup_s`` is the time from spawning the process to its first entry)
and stops when the outbox is empty. Meanwhile /proc gives the CPU each
side spent, reported as µs per row: the product's process, every PostgreSQL
backend, redis-server. That is the profile that says which side bounds a
drain that misses its target.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import psycopg
import redis as sync_redis

from benchmarks.baselines import spec_cycle, spec_schema_url
from benchmarks.env import BenchEnv
from benchmarks.workload import (
    STEP_US,
    Around,
    CpuMeter,
    enqueuer_command,
    prefill,
    processes,
    relay_command,
    wait_empty,
)
from dispatcher.stream import DEFAULT_SHARDS, SHARDS_KEY, queue_streams

ROWS = 50_000


def _published(client: sync_redis.Redis, streams: list[str]) -> int:
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
    return sum(pipe.execute())


def _timed_drain(
    env: BenchEnv,
    command: list[str],
    rows: int,
    size: int,
    *,
    fresh: bool = True,
    around: Around | None = None,
    step_us: int = STEP_US,
) -> dict[str, float]:
    queue = f"dr{uuid.uuid4().hex[:6]}"
    prefill(env.db_url, rows, queue=queue, size=size, fresh=fresh, step_us=step_us)
    client = sync_redis.Redis.from_url(env.redis_url)
    client.set(SHARDS_KEY, str(DEFAULT_SHARDS))
    streams = queue_streams([queue], DEFAULT_SHARDS)
    try:
        spawned = time.perf_counter()
        with processes([command]) as procs:
            deadline = spawned + 60
            while _published(client, streams) == 0:
                if time.perf_counter() > deadline or procs[0].poll() is not None:
                    raise RuntimeError(f"{command[2:4]} published nothing in 60 s")
                time.sleep(0.002)
            pids = [p.pid for p in procs]
            with around(pids) if around else contextlib.nullcontext():
                meter = CpuMeter(env.db_url, product=set(pids), redis_pid=env.redis_pid)
                started = time.perf_counter()
                first = _published(client, streams)
                while _published(client, streams) < rows:
                    time.sleep(0.005)
                wait_empty(env.db_url)
                wall = time.perf_counter() - started
                spent = meter.spent()
        moved = rows - first
        return {
            "product_us_per_row": spent["product"] / moved * 1e6,
            "postgres_us_per_row": spent["postgres"] / moved * 1e6,
            "redis_us_per_row": spent["redis"] / moved * 1e6,
            "startup_s": started - spawned,
            "rows_per_s": moved / wall,
        }
    finally:
        client.delete(*streams)
        client.close()


def enqueuer(
    env: BenchEnv,
    size: int,
    rows: int = ROWS,
    fresh: bool = True,
    around: Around | None = None,
    step_us: int = STEP_US,
) -> dict[str, float]:
    command = enqueuer_command(env.db_url, env.redis_url)
    return _timed_drain(env, command, rows, size, fresh=fresh, around=around, step_us=step_us)


def relay(env: BenchEnv, size: int, rows: int = ROWS) -> dict[str, float]:
    return _timed_drain(env, relay_command(env.db_url, env.redis_url), rows, size)


async def sql_only(
    env: BenchEnv,
    size: int,
    rows: int = ROWS,
    batch: int | None = None,
    fresh: bool = True,
    step_us: int = STEP_US,
) -> dict[str, float]:
    url = spec_schema_url(env.db_url)
    queue = f"sq{uuid.uuid4().hex[:6]}"
    prefill(url, rows, queue=queue, size=size, fresh=fresh, step_us=step_us)
    meter = CpuMeter(env.db_url, product=set(), redis_pid=0)
    spent: dict[str, float] = {}

    def done() -> None:  # while the cycle's backends are still there to read
        spent.update(meter.spent())

    rate = await spec_cycle(url, rows, publish=None, done=done, batch=batch)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
    return {
        "startup_s": 0.0,
        "product_us_per_row": 0.0,
        "postgres_us_per_row": spent["postgres"] / rows * 1e6,
        "redis_us_per_row": 0.0,
        "rows_per_s": rate,
    }
