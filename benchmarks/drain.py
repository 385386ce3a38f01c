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
count) and stops when the outbox is empty. Meanwhile /proc gives the CPU each
side spent, reported as µs per row: the product's process, every PostgreSQL
backend, redis-server. That is the profile that says which side bounds a
drain that misses its target.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import redis as sync_redis

from benchmarks.baselines import spec_cycle, spec_schema_url
from benchmarks.env import BenchEnv
from benchmarks.workload import (
    cpu_seconds,
    cpu_spent,
    enqueuer_command,
    outbox_count,
    prefill,
    processes,
    relay_command,
)
from dispatcher.stream import DEFAULT_SHARDS, SHARDS_KEY, queue_streams

ROWS = 50_000
WATCHED = {"postgres", "redis-server", "python", "python3", "dispatcher"}


def _published(client: sync_redis.Redis, streams: list[str]) -> int:
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
    return sum(pipe.execute())


def _timed_drain(env: BenchEnv, command: list[str], rows: int, size: int) -> dict[str, float]:
    queue = f"dr{uuid.uuid4().hex[:6]}"
    prefill(env.db_url, rows, queue=queue, size=size)
    client = sync_redis.Redis.from_url(env.redis_url)
    client.set(SHARDS_KEY, str(DEFAULT_SHARDS))
    streams = queue_streams([queue], DEFAULT_SHARDS)
    try:
        with processes([command]) as procs:
            while _published(client, streams) == 0:
                time.sleep(0.002)
            started, before = time.perf_counter(), cpu_seconds(WATCHED)
            first = _published(client, streams)
            while _published(client, streams) < rows:
                time.sleep(0.005)
            while outbox_count(env.db_url):
                time.sleep(0.005)
            wall = time.perf_counter() - started
            spent = cpu_spent(before, cpu_seconds(WATCHED), {p.pid for p in procs})
        moved = rows - first
        return {
            "product_us_per_row": spent["product"] / moved * 1e6,
            "postgres_us_per_row": spent["postgres"] / moved * 1e6,
            "redis_us_per_row": spent["redis-server"] / moved * 1e6,
            "rows_per_s": moved / wall,
        }
    finally:
        client.delete(*streams)
        client.close()


def enqueuer(env: BenchEnv, size: int, rows: int = ROWS) -> dict[str, float]:
    return _timed_drain(env, enqueuer_command(env.db_url, env.redis_url), rows, size)


def relay(env: BenchEnv, size: int, rows: int = ROWS) -> dict[str, float]:
    return _timed_drain(env, relay_command(env.db_url, env.redis_url), rows, size)


async def sql_only(env: BenchEnv, size: int, rows: int = ROWS) -> dict[str, float]:
    url = spec_schema_url(env.db_url)
    prefill(url, rows, queue=f"sq{uuid.uuid4().hex[:6]}", size=size)
    before = cpu_seconds(WATCHED)
    after: dict[int, tuple[str, float]] = {}

    def done() -> None:
        after.update(cpu_seconds(WATCHED))

    rate = await spec_cycle(url, rows, publish=None, done=done)
    spent = cpu_spent(before, after, set())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
    return {
        "product_us_per_row": 0.0,
        "postgres_us_per_row": spent["postgres"] / rows * 1e6,
        "redis_us_per_row": 0.0,
        "rows_per_s": rate,
    }
