"""Enqueuer figures under adverse conditions: an open inserting transaction, rows not yet due.

* ``flag_blocked``: commit -> stream while another session holds a transaction
  that inserted an outbox row and stays open (it holds the idle flag's lock
  shared, so nobody can take the flag and no commit NOTIFYs), at ~50 rows/s
  and for sparse commits (one per 0.5 s); the transaction opened while the
  enqueuer was busy draining a backlog, or already open when it starts; and
  the same with no such transaction.
* ``not_yet_due``: idle commit -> stream with 200,000 rows scheduled for later
  in the outbox, and with none; plus the pages one claim reads (EXPLAIN
  ANALYZE, BUFFERS) in each case.

Latencies come from Redis entry ids (the server's clock at XADD, 1 ms
resolution) minus the client's clock right after COMMIT, on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import psycopg

from benchmarks.enqueuer_bench import _dispatch, _with_enqueuer, idle_latency, percentile
from benchmarks.env import BenchEnv
from dispatcher.outbox import OutboxEnqueuer, enqueue_dispatch
from dispatcher.outbox.queries import QUERIES
from dispatcher.stream import task_stream
from tests.data import insert_rows

RATES = {"50/s": (50.0, 5.0), "sparse": (2.0, 10.0)}  # rows/s, seconds


async def flag_blocked(env: BenchEnv, *, rate: str, held: str) -> dict[str, float]:
    """``held``: "opened while draining", "open at start", or "none" (the baselines: "none
    after draining" drains the same backlog first, which leaves the table's dead tuples)."""
    per_s, seconds = RATES[rate]
    queue = f"fb{uuid.uuid4().hex[:6]}"
    with psycopg.connect(env.db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
    holder = await psycopg.AsyncConnection.connect(env.db_url)
    try:
        if held == "open at start":
            await _insert_and_hold(holder, queue)
        draining = held in ("opened while draining", "none after draining")
        if draining:
            insert_rows(env.db_url, 20_000, queue=f"{queue}bl", prefix=f"{queue}-bl-")

        async def body(enqueuer: OutboxEnqueuer, redis: Any) -> dict[str, float]:
            while not enqueuer.ready():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            if draining:
                await _wait_outbox(env.db_url, lambda left: left < 15_000)  # busy draining
                if held == "opened while draining":
                    await _insert_and_hold(holder, queue)
                await _wait_outbox(env.db_url, lambda left: left == 0)
            committed = await asyncio.to_thread(_paced, env.db_url, queue, per_s, seconds)
            latencies = await _latencies(redis, queue, committed)
            return {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99)}

        result: dict[str, float] = await _with_enqueuer(env, "pipelined", True, body)
        return result
    finally:
        await holder.rollback()
        await holder.close()


async def _insert_and_hold(conn: psycopg.AsyncConnection[Any], queue: str) -> None:
    await conn.execute(
        "INSERT INTO outbox (id, stream, payload) VALUES (%s, %s, '{}')",
        (f"held-{uuid.uuid4().hex[:8]}", task_stream(queue, 0)),
    )


async def _wait_outbox(url: str, done: Any) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            row = await (await conn.execute("SELECT count(*) FROM outbox")).fetchone()
            if row is not None and done(row[0]):
                return
            await asyncio.sleep(0.01)


def _paced(db_url: str, queue: str, rate: float, seconds: float) -> dict[str, float]:
    """Commit one dispatch per transaction at ``rate``/s; commit wall times (ms) by id."""
    committed: dict[str, float] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            outbox_id = enqueue_dispatch(conn, _dispatch(f"p{i}", queue), shards=4)
            committed[outbox_id] = time.time() * 1000
    return committed


async def _latencies(redis: Any, queue: str, committed: dict[str, float]) -> list[float]:
    deadline = time.monotonic() + 30
    while True:
        seen: dict[str, int] = {}
        for shard in range(4):
            for entry_id, fields in await redis.xrange(task_stream(queue, shard)):
                seen[fields["outbox_id"]] = int(entry_id.split("-")[0])
        if set(committed) <= set(seen) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    missing = set(committed) - set(seen)
    if missing:
        raise RuntimeError(f"{len(missing)} commits did not reach Redis within 30 s")
    return [seen[i] - committed[i] for i in committed]


NOT_YET_DUE = """
INSERT INTO outbox (id, task_id, stream, payload, next_attempt_at)
SELECT 'later-' || g, 'later-' || g, 'workflow.tasks.later.0', '{}', now() + interval '1 day'
  FROM generate_series(1, %(n)s) AS g
"""


async def not_yet_due(env: BenchEnv, *, waiting: int) -> dict[str, float]:
    """Idle commit -> stream with ``waiting`` rows scheduled a day ahead; claim pages read."""
    with psycopg.connect(env.db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
        if waiting:
            conn.execute(NOT_YET_DUE, {"n": waiting})
        conn.execute("VACUUM ANALYZE outbox")
    pages = _claim_pages(env.db_url)
    figures = await idle_latency(env, "pipelined")
    return {"claim_pages": pages, "p99_ms": figures["p99_ms"], "p50_ms": figures["p50_ms"]}


def _claim_pages(url: str) -> float:
    """Pages one claim reads (shared hit + read), from EXPLAIN (ANALYZE, BUFFERS)."""
    with psycopg.connect(url) as conn:
        conn.execute(QUERIES["prepare_claim_batch"])
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE outbox_claim_batch (100)"
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    return float(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
