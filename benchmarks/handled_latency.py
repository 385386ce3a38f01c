"""Commit -> handled by a worker at idle: outbox-dispatcher against procrastinate.

One task at a time (~20 ms idle gaps; the realistic ~433-byte task of
``benchmarks.workload``, as job arguments for procrastinate), a no-op handler
that only records ``time.perf_counter()`` when it starts; the sample is that start time minus the
moment the application's transaction commit returned.

- ``ours``: the application commits ``enqueue_dispatch`` on an ordinary
  psycopg connection (synchronous commit); an in-process ``OutboxEnqueuer``
  (default ``EnqueuerConfig``, LISTEN on, ``enqueuer_pool``, its listener's
  thread publishing as ``dispatcher enqueuer``'s does) publishes it and an
  in-process ``Worker`` (one shard) runs the handler.
- ``procrastinate``: procrastinate 3.x with its ``PsycopgConnector`` on a
  database of its own (created and dropped per call, schema applied through its
  ``schema_manager``); the job is deferred with ``defer_async`` inside the
  application's transaction (``configure(connection=...)``), so the clock starts
  when that transaction's commit returned, exactly as for ours. The worker is
  ``app.run_worker_async(install_signal_handlers=False)`` in a task, stopped by
  cancelling it (procrastinate's way to embed a worker in an asyncio app); every
  other worker option is procrastinate's default (listen/notify on, 5 s polling
  fallback, concurrency 1).

procrastinate is NOT a dependency of outbox-dispatcher. It lives in a separate
venv that only the benchmarks use::

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -e . -r benchmarks/requirements-bench.txt
    .venv-bench/bin/python -m benchmarks.run --rounds 3 --only handled_latency

Run from the main ``.venv`` (no procrastinate), the ``handled_latency`` figure is
reported as skipped and every other figure runs as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.env import ADMIN_URL, BenchEnv
from benchmarks.probe import percentile
from benchmarks.workload import dispatch
from dispatcher.models import TaskMessage
from dispatcher.outbox import EnqueuerConfig, OutboxEnqueuer, OutboxRepository, enqueue_dispatch
from dispatcher.outbox.repository import enqueuer_pool
from dispatcher.redis_client import connect_redis
from dispatcher.stream import RedisStreamPublisher, publish_shard_count
from dispatcher.stream.naming import WORKER_GROUP
from dispatcher.worker import Worker, WorkerConfig

SAMPLES = 200
WARMUP = 5  # first tasks (connections, prepared plans, stream groups) are not counted
GAP = 0.02  # idle time before each commit, seconds
TIMEOUT = 10.0  # one task not handled by then fails the measure

SKIP_LINE = "skipped: run with .venv-bench/bin/python -m benchmarks.run"
HAVE_PROCRASTINATE = importlib.util.find_spec("procrastinate") is not None


def _summary(latencies: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99)}


async def _sample_loop(commit: Callable[[int], Awaitable[float]], started: dict[int, float],
                       handled: dict[int, asyncio.Event], samples: int) -> list[float]:  # fmt: skip
    """Commit task ``i`` after an idle gap, wait for its handler; warm-ups not counted."""
    latencies: list[float] = []
    for i in range(WARMUP + samples):
        handled[i] = asyncio.Event()
        await asyncio.sleep(GAP)
        committed = await commit(i)
        await asyncio.wait_for(handled[i].wait(), TIMEOUT)
        if i >= WARMUP:
            latencies.append((started[i] - committed) * 1000)
    return latencies


# -- outbox-dispatcher ---------------------------------------------------------


async def ours(env: BenchEnv, samples: int = SAMPLES) -> dict[str, float]:
    """App commit (enqueue_dispatch) -> our Worker's no-op handler starts."""
    queue = f"hl{uuid.uuid4().hex[:6]}"
    started: dict[int, float] = {}
    handled: dict[int, asyncio.Event] = {}

    async def handler(message: TaskMessage) -> None:
        now = time.perf_counter()
        i = int(message.task_id.rpartition("-")[2])
        started[i] = now
        handled[i].set()

    config = EnqueuerConfig()
    pool = enqueuer_pool(env.db_url, max_size=config.concurrency + 2)  # as the CLI sizes it
    await pool.open(wait=True)
    enqueuer_redis, worker_redis = connect_redis(env.redis_url), connect_redis(env.redis_url)
    await publish_shard_count(enqueuer_redis, 1)  # one shard, as the worker reads
    enqueuer = OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=RedisStreamPublisher(enqueuer_redis, group=WORKER_GROUP),
        config=config,
        listen_conninfo=env.db_url,
    )
    worker = Worker(worker_redis, handler, WorkerConfig(queues=(queue,), shards=1, block_ms=1000))
    tasks = [asyncio.create_task(enqueuer.run()), asyncio.create_task(worker.run())]
    app = psycopg.connect(env.db_url)  # the application's own session

    async def commit(i: int) -> float:
        enqueue_dispatch(app, dispatch(f"{queue}-{i}", queue))
        app.commit()  # blocking, like an ordinary application's commit
        return time.perf_counter()

    try:
        while not (enqueuer.listener and enqueuer.listener.connected and worker.ready()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        return _summary(await _sample_loop(commit, started, handled, samples))
    finally:
        app.close()
        worker.request_stop()
        enqueuer.request_stop()
        await asyncio.gather(*tasks)
        await pool.close()
        await enqueuer_redis.aclose()
        await worker_redis.aclose()


# -- procrastinate -------------------------------------------------------------


@contextlib.asynccontextmanager
async def _fresh_database() -> AsyncIterator[str]:
    """A database of procrastinate's own on the bench server, dropped afterwards."""
    name = f"od_bench_pc_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    finally:
        async with await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def procrastinate_latency(env: BenchEnv, samples: int = SAMPLES,
                                in_transaction: bool = True) -> dict[str, float]:  # fmt: skip
    """App commit (defer_async in its transaction) -> procrastinate task starts.

    ``in_transaction=False`` defers on procrastinate's own pool instead (the clock
    then starts when ``defer_async`` returned).
    """
    import procrastinate  # the bench venv only; see the module docstring

    del env  # procrastinate needs neither the outbox database nor Redis
    started: dict[int, float] = {}
    handled: dict[int, asyncio.Event] = {}
    async with _fresh_database() as db_url:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=db_url))

        # The same realistic task body as ours, as the job's arguments.
        body = dispatch("t", "q").payload()

        @app.task(name="bench_noop")
        async def noop(i: int, task: dict[str, Any]) -> None:
            now = time.perf_counter()
            started[i] = now
            handled[i].set()

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            worker = asyncio.create_task(app.run_worker_async(install_signal_handlers=False))
            session = await psycopg.AsyncConnection.connect(db_url)  # the application's

            async def commit(i: int) -> float:
                if not in_transaction:
                    await noop.defer_async(i=i, task=body)
                    return time.perf_counter()
                await noop.configure(connection=session).defer_async(i=i, task=body)
                await session.commit()
                return time.perf_counter()

            try:
                await _wait_listening(db_url)
                return _summary(await _sample_loop(commit, started, handled, samples))
            finally:
                await session.close()
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker


async def _wait_listening(db_url: str) -> None:
    """Until procrastinate's worker session is LISTENing (its notify would be lost before)."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' AND datname = %s"
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for _ in range(500):
            row = await (await conn.execute(sql, (dbname,))).fetchone()
            if row and row[0]:
                return
            await asyncio.sleep(0.01)
    raise RuntimeError("procrastinate's worker never started listening")


# -- the figure ----------------------------------------------------------------

_skip_told = False


def skipped(env: BenchEnv) -> dict[str, float]:
    """Stand-in for the whole figure when procrastinate is not installed here."""
    global _skip_told
    if not _skip_told:
        print(f"[handled_latency] procrastinate is not importable: {SKIP_LINE}", file=sys.stderr)
        _skip_told = True
    return {}


def figure() -> tuple[str, dict[str, Callable[[BenchEnv], Any]]]:
    """``run.py``'s FIGURES entry: both variants, or one 'skipped' row without procrastinate."""
    title = "commit -> handled by a worker (no-op handler) at idle, one task at a time (ms)"
    if not HAVE_PROCRASTINATE:
        return f"{title}: {SKIP_LINE}", {SKIP_LINE: skipped}
    return title, {"outbox-dispatcher": ours, "procrastinate": procrastinate_latency}
