"""Cancelling a run: ``cancel_run`` in the application's transaction, the enqueuer's relay to
Redis, and what two workers then do with the run's entries and running handlers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from dispatcher import cancel_requested, cancel_run, cancel_run_async, enqueue_dispatch_async
from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.outbox import CancelMissing, InvalidRunId
from dispatcher.redis_client import RedisClient
from dispatcher.stream.cancel_keys import (
    CANCEL_SIGNAL,
    CANCELLED_RUNS,
    cancelled_runs,
    count_cancelled,
    record_cancels,
    wait_for_signal,
)
from dispatcher.stream.naming import dead_letter_stream
from dispatcher.worker import Worker
from tests import enqueuers, workers
from tests.commands import cli
from tests.data import tasks
from tests.waiting import eventually

SLOTS = 4  # per worker; two workers


@dataclasses.dataclass
class Run:
    """What the handler saw: starts by run, and how the blocked runs of the cancelled run ended."""

    cancelled_run: str
    handled_first: int
    starts: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    handled: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    blocked: list[str] = dataclasses.field(default_factory=list)
    saw_cancel: list[str] = dataclasses.field(default_factory=list)
    gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def handle(self, message: TaskMessage) -> None:
        started = self.starts.setdefault(message.run_id, [])
        started.append(message.task_id)
        if message.run_id == self.cancelled_run and len(started) > self.handled_first:
            self.blocked.append(message.task_id)
            try:
                await self.gate.wait()  # never set: only the cancel ends it
            except asyncio.CancelledError:
                self.saw_cancel.append(message.task_id)
                raise
        self.handled.setdefault(message.run_id, []).append(message.task_id)


async def _commit(pool: AsyncConnectionPool[Any], dispatches: list[TaskDispatch]) -> None:
    async with pool.connection() as conn, conn.transaction():
        for dispatch in dispatches:
            await enqueue_dispatch_async(conn, dispatch)


def _worker(redis: RedisClient, queue: str, run: Run, name: str) -> Worker:
    config = workers.config(queue, concurrency=SLOTS, consumer=name)
    return Worker(redis, run.handle, config, registry=CollectorRegistry())


async def _cancelled(*ws: Worker, queue: str) -> float:
    return sum(
        [await workers.metric(w, "dispatcher_worker_cancelled_total", queue=queue) for w in ws]
    )


async def _backlog(redis: RedisClient, queue: str) -> int:
    """Entries still in the queue's shard streams (acked entries are deleted)."""
    total = 0
    async for stream in redis.scan_iter(match=f"workflow.tasks.{queue}.*", _type="STREAM"):
        total += int(await redis.xlen(stream))
    return total


async def test_a_committed_cancel_stops_the_run_on_two_workers(
    pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, outbox_db_url: str, queue: str
) -> None:
    doomed = tasks(queue, 500, prefix="doomed")
    other = tasks(queue, 50, prefix="other")
    run = Run(cancelled_run=doomed[0].run_id, handled_first=100)
    enqueuer = enqueuers.make_enqueuer(
        pool, redis_standalone, listen=outbox_db_url, dedup_window=120.0
    )
    w1, w2 = (_worker(redis_standalone, queue, run, name) for name in ("w1", "w2"))
    async with enqueuers.running(enqueuer), workers.running(w1, w2):
        await _commit(pool, doomed[:250] + other + doomed[250:])
        # 100 of the run handled, then every slot of both workers holds a run of it that waits.
        await eventually(lambda: len(run.blocked) == 2 * SLOTS, within=30)
        assert len(run.handled.get(run.cancelled_run, [])) == 100

        async with pool.connection() as conn:  # a cancel rolled back cancels nothing
            async with conn.transaction(force_rollback=True):
                await cancel_run_async(conn, other[0].run_id)
            async with conn.transaction():
                await cancel_run_async(conn, run.cancelled_run)
        starts_at_commit = len(run.starts[run.cancelled_run])

        await eventually(lambda: len(run.saw_cancel) == 2 * SLOTS, within=30)
        await eventually(lambda: len(run.handled.get(other[0].run_id, [])) == 50, within=30)
        await eventually(lambda: _backlog_is(redis_standalone, queue, 0), within=30)

        # A task of the cancelled run committed later is cancelled too.
        late = [t.model_copy(update={"task_id": f"late-{t.task_id}"}) for t in doomed[:5]]
        await _commit(pool, late)
        await eventually(lambda: _cancelled_is(w1, w2, queue=queue, n=400 + 5), within=30)

    assert sorted(run.saw_cancel) == sorted(run.blocked)
    assert len(run.starts[run.cancelled_run]) == starts_at_commit, "a run started after cancel"
    assert len(run.handled[run.cancelled_run]) == 100
    assert sorted(run.handled[other[0].run_id]) == sorted(t.task_id for t in other)
    assert run.starts[other[0].run_id] == run.handled[other[0].run_id]  # each ran once
    assert await _cancelled(w1, w2, queue=queue) == 500 - 100 + 5
    assert not await redis_standalone.exists(dead_letter_stream(queue))
    assert await _backlog(redis_standalone, queue) == 0
    assert await redis_standalone.zscore(CANCELLED_RUNS, run.cancelled_run) is not None
    assert await redis_standalone.zscore(CANCELLED_RUNS, other[0].run_id) is None


async def _backlog_is(redis: RedisClient, queue: str, n: int) -> bool:
    return await _backlog(redis, queue) == n


async def _cancelled_is(*ws: Worker, queue: str, n: int) -> bool:
    return await _cancelled(*ws, queue=queue) == n


def _outbox_runs(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT payload->>'run_id' FROM outbox ORDER BY 1").fetchall()
    return [str(row[0]) for row in rows]


def _cancel_rows(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [str(r[0]) for r in conn.execute("SELECT run_id FROM outbox_cancel").fetchall()]


async def test_cancel_run_deletes_the_runs_waiting_rows_only_when_committed(
    pool: AsyncConnectionPool[Any], outbox_db_url: str, queue: str
) -> None:
    doomed, other = tasks(queue, 10, prefix="gone"), tasks(queue, 3, prefix="kept")
    await _commit(pool, doomed + other)
    with psycopg.connect(outbox_db_url) as conn:
        assert cancel_run(conn, "run-gone") == 10
        conn.rollback()
    assert len(_outbox_runs(outbox_db_url)) == 13
    assert _cancel_rows(outbox_db_url) == []
    with psycopg.connect(outbox_db_url) as conn:
        assert cancel_run(conn, "run-gone") == 10
    assert _outbox_runs(outbox_db_url) == ["run-kept"] * 3
    assert _cancel_rows(outbox_db_url) == ["run-gone"]


@pytest.mark.parametrize("run_id", ["", "a\x00b", None, 7])
def test_a_run_id_that_names_no_run_is_refused_before_any_statement(
    outbox_db_url: str, run_id: Any
) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        with pytest.raises(InvalidRunId):
            cancel_run(conn, run_id)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_without_the_schema_cancel_run_says_to_migrate(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url) as conn, pytest.raises(CancelMissing, match="migrate"):
        cancel_run(conn, "run-x")


async def test_a_sync_handler_asks_and_its_failure_after_a_cancel_is_no_dead_letter(
    pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, outbox_db_url: str, queue: str
) -> None:
    asked: list[str] = []
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def handle(message: TaskMessage) -> None:
        loop.call_soon_threadsafe(started.set)
        while not cancel_requested(message):
            threading.Event().wait(0.01)
        asked.append(message.task_id)
        raise RuntimeError("stopped early: the run was cancelled")

    enqueuer = enqueuers.make_enqueuer(pool, redis_standalone, listen=outbox_db_url)
    config = workers.config(queue, concurrency=1, max_runs=1)
    worker = Worker(redis_standalone, handle, config, registry=CollectorRegistry())
    async with enqueuers.running(enqueuer), workers.running(worker):
        await _commit(pool, tasks(queue, 1, prefix="sync"))
        await asyncio.wait_for(started.wait(), 30)
        async with pool.connection() as conn, conn.transaction():
            await cancel_run_async(conn, "run-sync")
        await eventually(lambda: _cancelled_is(worker, queue=queue, n=1), within=30)
    assert asked == ["t-sync-0"]
    assert not await redis_standalone.exists(dead_letter_stream(queue))
    assert await _backlog(redis_standalone, queue) == 0


async def test_garbage_in_the_cancel_keys_and_channel_stops_nothing(
    pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, outbox_db_url: str, queue: str
) -> None:
    """Who may write them (docs/security.md) can cancel runs; garbage does nothing else."""
    await redis_standalone.zadd(CANCELLED_RUNS, {"x" * 100_000: 9e15, "": 9e15})
    await redis_standalone.execute_command("ZADD", CANCELLED_RUNS, 9e15, b"\xff\xfe")
    await redis_standalone.execute_command("XADD", CANCEL_SIGNAL, "*", b"\xff", b"\x00\xfe")
    run = Run(cancelled_run="run-late", handled_first=0)
    enqueuer = enqueuers.make_enqueuer(pool, redis_standalone, listen=outbox_db_url)
    worker = _worker(redis_standalone, queue, run, "w")
    async with enqueuers.running(enqueuer), workers.running(worker):
        async with pool.connection() as conn:
            await conn.execute("NOTIFY outbox_cancel, 'DROP TABLE outbox'")
        await redis_standalone.execute_command("XADD", CANCEL_SIGNAL, "*", b"runs", b"\xff" * 9)
        await _commit(pool, tasks(queue, 20, prefix="fine") + tasks(queue, 1, prefix="late"))
        await eventually(lambda: len(run.handled.get("run-fine", [])) == 20, within=30)
        await eventually(lambda: run.blocked == ["t-late-0"], within=30)
        assert worker.live()
        async with pool.connection() as conn, conn.transaction():
            await cancel_run_async(conn, "run-late")
        await eventually(lambda: run.saw_cancel == ["t-late-0"], within=30)
        await eventually(lambda: _cancelled_is(worker, queue=queue, n=1), within=30)


async def test_the_cancel_command_commits_and_status_counts_cancels(
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    outbox_db_url: str,
    redis_url: str,
    queue: str,
) -> None:
    await _commit(pool, tasks(queue, 4, prefix="cli"))
    done = cli("cancel", "--run", "run-cli", db_url=outbox_db_url, redis_url=redis_url)
    assert done.returncode == 0, done.stderr
    assert "4 outbox rows removed" in done.stdout
    assert _outbox_runs(outbox_db_url) == []
    status = json.loads(cli("status", "--json", db_url=outbox_db_url, redis_url=redis_url).stdout)
    assert (status["cancelled_runs"], status["cancels_waiting"]) == (0, 1)

    enqueuer = enqueuers.make_enqueuer(pool, redis_standalone, listen=outbox_db_url)
    async with enqueuers.running(enqueuer):
        await eventually(lambda: _cancel_rows(outbox_db_url) == [], within=30)
    status = json.loads(cli("status", "--json", db_url=outbox_db_url, redis_url=redis_url).stdout)
    assert (status["cancelled_runs"], status["cancels_waiting"]) == (1, 0)

    empty = cli("cancel", "--run", "", db_url=outbox_db_url, redis_url=redis_url)
    assert empty.returncode == 2
    why = "run_id must not be empty (it would name every task without a run)"
    assert empty.stderr.strip().splitlines() == [f"dispatcher cancel: --run: {why}"]


async def test_the_cancel_record_on_standalone_and_cluster(any_redis: RedisClient) -> None:
    assert await wait_for_signal(any_redis, after="0-0", block_ms=1) is None
    await record_cancels(any_redis, ["run-a", "run-b"], ttl_ms=60_000)
    await record_cancels(any_redis, ["run-short"], ttl_ms=1)
    signalled = await wait_for_signal(any_redis, after="0-0", block_ms=1)
    assert signalled is not None
    assert await wait_for_signal(any_redis, after=signalled, block_ms=1) is None
    await eventually(lambda: _runs_are(any_redis, ["run-a", "run-b"]))
    assert await count_cancelled(any_redis) == 2
    assert await cancelled_runs(any_redis, limit=1) in (["run-a"], ["run-b"])


async def _runs_are(redis: RedisClient, runs: list[str]) -> bool:
    return sorted(await cancelled_runs(redis, limit=10)) == runs


async def test_cancel_keys_of_the_wrong_type_stop_neither_enqueuer_nor_worker(
    pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, outbox_db_url: str, queue: str
) -> None:
    await redis_standalone.set(CANCELLED_RUNS, "not a sorted set")
    await redis_standalone.set(CANCEL_SIGNAL, "not a stream")
    seen: list[str] = []
    enqueuer = enqueuers.make_enqueuer(pool, redis_standalone, listen=outbox_db_url)
    handler, config = workers.recorder(seen), workers.config(queue)
    worker = Worker(redis_standalone, handler, config, registry=CollectorRegistry())
    async with enqueuers.running(enqueuer), workers.running(worker):
        async with pool.connection() as conn, conn.transaction():
            await cancel_run_async(conn, "run-stuck")
        await _commit(pool, tasks(queue, 10, prefix="fine"))
        await eventually(lambda: len(seen) == 10, within=30)
        assert worker.live()
    assert _cancel_rows(outbox_db_url) == ["run-stuck"], "kept until Redis can record it"
