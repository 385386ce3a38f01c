"""The demo pipeline: producers commit (and roll back) dispatches, the enqueuer publishes,
workers handle; a live progress bar, then a summary and a pass/fail check.

Everything runs in this process on one event loop, against real PostgreSQL and
Redis. Timestamps are ``time.perf_counter()`` in this process, so latencies
need no clock agreement between machines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis  # a dependency: redis[hiredis]
import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.demo.verdict import Latency, Verdict, latency, verdict
from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.outbox import (
    EnqueuerConfig,
    OutboxEnqueuer,
    OutboxRepository,
    enqueue_dispatch_async,
    migrate,
)
from dispatcher.outbox.repository import enqueuer_pool
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import (
    RedisStreamPublisher,
    dead_letter_stream,
    queue_streams,
    read_shard_count,
)
from dispatcher.stream.naming import WORKER_GROUP
from dispatcher.stream.shard_count import ensure_shard_count
from dispatcher.worker import Worker, WorkerConfig

__all__ = ["DemoResult", "Progress", "run_demo"]


@dataclass
class Progress:
    """Counters the progress display reads while the demo runs."""

    total: int
    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    commit_at: dict[str, float] = field(default_factory=dict)
    published_at: dict[str, float] = field(default_factory=dict)
    handled_at: dict[str, float] = field(default_factory=dict)
    handled_runs: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class DemoResult:
    verdict: Verdict
    seconds: float
    to_stream: Latency | None
    to_handled: Latency | None
    dead_letters: int
    servers: list[str]

    @property
    def throughput(self) -> float:
        return self.verdict.handled / self.seconds if self.seconds else 0.0


class _RecordingPublisher(RedisStreamPublisher):
    """Notes when each task's entry was stored, for the commit -> stream latency."""

    def __init__(self, client: RedisClient, progress: Progress) -> None:
        super().__init__(client, group=WORKER_GROUP)
        self._progress = progress

    async def publish_packed(
        self, streams: Sequence[str], commands: Sequence[bytes], **kw: Any
    ) -> list[Any]:
        replies = await super().publish_packed(streams, commands, **kw)
        now = time.perf_counter()
        for command, reply in zip(commands, replies, strict=True):
            if not isinstance(reply, BaseException):
                self._progress.published_at.setdefault(_task_id(command), now)
        return replies


def _task_id(command: bytes) -> str:
    """The task_id field of a packed XADD command (the demo's own payloads have one)."""
    reader = hiredis.Reader(encoding="utf-8")
    reader.feed(command)
    args = reader.gets()
    fields = dict(zip(args[3::2], args[4::2], strict=True)) if isinstance(args, list) else {}
    return str(fields.get("task_id", ""))


async def _produce(
    pool: AsyncConnectionPool[Any],
    progress: Progress,
    *,
    queue: str,
    batch: int,
    rollback_ratio: float,
    rng: random.Random,
) -> None:
    """Commit dispatches ``batch`` at a time; roll back about ``rollback_ratio`` of batches."""
    for start in range(0, progress.total, batch):
        ids = [f"demo-{queue}-{i}" for i in range(start, min(start + batch, progress.total))]
        roll_back = rng.random() < rollback_ratio
        async with pool.connection() as conn, conn.transaction(force_rollback=roll_back):
            for task_id in ids:
                await enqueue_dispatch_async(conn, _dispatch(task_id, queue))
        now = time.perf_counter()
        if roll_back:
            progress.rolled_back.update(ids)
        else:
            progress.committed.update(ids)
            progress.commit_at.update(dict.fromkeys(ids, now))


def _dispatch(task_id: str, queue: str) -> TaskDispatch:
    return TaskDispatch(
        task_id=task_id,
        run_id="demo-run",
        workflow_id="demo",
        workflow_version=1,
        node_id=task_id.rsplit("-", 1)[-1],
        node_type="noop",
        queue=queue,
        attempt=1,
        input='{"hello": "world"}',
    )


def _handler(progress: Progress) -> Any:
    async def handle(message: TaskMessage) -> None:
        progress.handled_runs[message.task_id] += 1
        progress.handled_at.setdefault(message.task_id, time.perf_counter())

    return handle


async def run_demo(
    *,
    database_url: str,
    redis_url: str,
    tasks: int,
    servers: list[str],
    workers: int = 2,
    batch: int = 20,
    rollback_ratio: float = 0.05,
    give_up_after: float = 120.0,
    on_tick: Any = None,
    seed: int | None = None,
) -> DemoResult:
    """Run the pipeline once over ``tasks`` dispatches; ``on_tick(progress)`` ~10x a second."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await migrate(conn)
    queue = f"demo{uuid.uuid4().hex[:6]}"
    progress = Progress(total=tasks)
    redis = connect_redis(redis_url)
    pool = enqueuer_pool(database_url, max_size=6, application_name="outbox-dispatcher-demo")
    # The producers are "the application": ordinary sessions, synchronous commits.
    app_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True, timeout=30)
    await app_pool.open(wait=True, timeout=30)
    await ensure_shard_count(redis, 4)  # as a first enqueuer does when the key is absent
    shards = await read_shard_count(redis)
    enqueuer = OutboxEnqueuer(
        repository=OutboxRepository(pool),
        publisher=_RecordingPublisher(redis, progress),
        config=EnqueuerConfig(batch_size=100),
        listen_conninfo=database_url,
    )
    config = WorkerConfig(queues=(queue,), concurrency=32, shards=shards, dedup_window=600)
    pool_workers = [
        Worker(redis, _handler(progress), dataclasses.replace(config, consumer=f"demo-{n}"))
        for n in range(workers)
    ]
    runs = [asyncio.create_task(enqueuer.run())]
    runs += [asyncio.create_task(w.run()) for w in pool_workers]
    started = time.perf_counter()
    producing: asyncio.Task[None] | None = None
    try:
        producing = asyncio.create_task(
            _produce(
                app_pool,
                progress,
                queue=queue,
                batch=batch,
                rollback_ratio=rollback_ratio,
                rng=random.Random(seed),
            )
        )
        deadline = started + give_up_after
        while time.perf_counter() < deadline:
            if on_tick:
                on_tick(progress)
            if producing.done() and progress.committed <= progress.handled_runs.keys():
                break
            await asyncio.sleep(0.1)
        await producing
        elapsed = time.perf_counter() - started
        if on_tick:
            on_tick(progress)
    finally:
        if producing is not None and not producing.done():  # interrupted: stop the producer
            producing.cancel()  # before its pool closes under it
            await asyncio.gather(producing, return_exceptions=True)
        enqueuer.request_stop()
        for w in pool_workers:
            w.request_stop()
        await asyncio.gather(*runs, return_exceptions=True)
        dead = int(await redis.xlen(dead_letter_stream(queue)))
        await redis.delete(*queue_streams([queue], shards), dead_letter_stream(queue))
        await pool.close()
        await app_pool.close()
        await redis.aclose()
    return DemoResult(
        verdict=verdict(progress.committed, progress.rolled_back, progress.handled_runs),
        seconds=elapsed,
        to_stream=latency(progress.commit_at, progress.published_at),
        to_handled=latency(progress.commit_at, progress.handled_at),
        dead_letters=dead,
        servers=servers,
    )
