"""Cancel latency: ``python -m benchmarks.cancel_latency [--rounds 30]``.

What it measures: the time from the return of a ``cancel_run`` commit to the
moment a running async handler of that run sees ``CancelledError``: the
notification on ``outbox_cancel``, the enqueuer's relay (one short
transaction, the Redis record and signal) and the worker's ``XREAD`` wake-up,
end to end. Not a bound the code promises (docs/guarantees.md says so): the
figure behind "milliseconds, with the connections live".

How: a private PostgreSQL and redis-server on free ports, an enqueuer (with
its LISTEN connections) and one worker on one event loop, as the tests run
them. Each round commits one task of a new run, waits until its handler runs
(it waits for ever), commits the run's cancel and times the handler's
``CancelledError``. Prints the median, p90 and max with the load average
before and after, and writes ``benchmarks/results/cancel_latency.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from benchmarks.workload import ROOT, load_average
from dispatcher import (
    EnqueuerConfig,
    OutboxEnqueuer,
    TaskDispatch,
    TaskMessage,
    Worker,
    WorkerConfig,
    cancel_run_async,
    enqueue_dispatch_async,
)
from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from dispatcher.outbox import OutboxRepository, migrate
from dispatcher.redis_client import connect_redis
from dispatcher.stream import RedisStreamPublisher
from dispatcher.stream.naming import WORKER_GROUP

RESULT = ROOT / "benchmarks" / "results" / "cancel_latency.md"
QUEUE = "cancelbench"


class Probe:
    """The handler: notes when a run starts, and when the cancel reaches it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.cancelled_at = 0.0

    async def handle(self, message: TaskMessage) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled_at = time.perf_counter()
            self.cancelled.set()
            raise


async def measure(db_url: str, redis_url: str, rounds: int) -> list[float]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await migrate(conn)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        db_url, min_size=2, max_size=8, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    redis = connect_redis(redis_url)
    enqueuer = OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=RedisStreamPublisher(redis, group=WORKER_GROUP),
        config=EnqueuerConfig(),
        listen_conninfo=db_url,
        registry=CollectorRegistry(),
    )
    probe = Probe()
    worker = Worker(
        redis, probe.handle, WorkerConfig(queues=(QUEUE,)), registry=CollectorRegistry()
    )
    tasks = [asyncio.create_task(enqueuer.run()), asyncio.create_task(worker.run())]
    latencies = []
    try:
        for i in range(rounds + 1):  # the first round warms up
            run_id = f"run-{uuid.uuid4().hex[:8]}"
            probe.started.clear()
            probe.cancelled.clear()
            async with pool.connection() as conn, conn.transaction():
                await enqueue_dispatch_async(conn, _task(run_id))
            await asyncio.wait_for(probe.started.wait(), 30)
            async with pool.connection() as conn:
                async with conn.transaction():
                    await cancel_run_async(conn, run_id)
                committed = time.perf_counter()
            await asyncio.wait_for(probe.cancelled.wait(), 30)
            if i:
                latencies.append(probe.cancelled_at - committed)
    finally:
        enqueuer.request_stop()
        worker.request_stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await redis.aclose()
        await pool.close()
    return latencies


def _task(run_id: str) -> TaskDispatch:
    return TaskDispatch(
        task_id=f"t-{run_id}",
        run_id=run_id,
        workflow_id="wf",
        workflow_version=1,
        node_id="n",
        node_type="bench",
        queue=QUEUE,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-cancel-"))
    workdir.chmod(0o755)  # PostgreSQL runs as its own user
    pg = PostgresProcess(workdir / "pg").start()
    redis = RedisProcess(workdir / "redis").start()
    before = load_average()
    try:
        latencies = asyncio.run(measure(pg.url(), redis.url, args.rounds))
    finally:
        redis.kill()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    after = load_average()
    ms = sorted(v * 1000 for v in latencies)
    p90 = ms[max(int(len(ms) * 0.9) - 1, 0)]
    command = " ".join(["python -m benchmarks.cancel_latency", *sys.argv[1:]])
    table = (
        "| rounds | median ms | p90 ms | max ms |\n|---|---|---|---|\n"
        f"| {len(ms)} | {statistics.median(ms):.1f} | {p90:.1f} | {ms[-1]:.1f} |\n"
    )
    text = (
        "# Cancel latency: commit of cancel_run -> CancelledError in the running handler\n\n"
        f"`{command}`; load average before {before}, after {after}.\n\n{table}"
    )
    print(text)
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
