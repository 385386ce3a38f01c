"""What an attempt is: runs counted in Redis, entries in hand kept fresh, one bad entry alone.

Workers are ``Worker`` objects on the test's event loop (see
``test_worker_runtime``); handlers record their runs in memory. The process
scenarios (SIGKILL, SIGTERM past the grace period) are in
``test_worker_process``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count, task_stream
from dispatcher.worker import Worker, attempt_key
from tests.data import publish, read_attempt, tasks
from tests.waiting import eventually
from tests.workers import config, metric, running


async def _handled(worker: Worker, queue: str, count: int) -> bool:
    return await metric(worker, "dispatcher_worker_handled_total", queue=queue) >= count


async def _dead(client: RedisClient, queue: str) -> list[tuple[str, dict[str, str]]]:
    return await client.xrange(dead_letter_stream(queue))  # type: ignore[no-any-return]


async def test_a_long_run_that_fails_once_runs_twice_and_is_handled(
    redis_standalone: RedisClient, queue: str
) -> None:
    """A 6 s handler, reclaim-idle 1 s, max runs 3: no reclaim loop takes it while it runs."""
    await publish_shard_count(redis_standalone, 1)
    runs: list[float] = []

    def handle(message: TaskMessage) -> None:  # sync: a thread
        runs.append(time.monotonic())
        time.sleep(6)
        if len(runs) == 1:
            raise RuntimeError("the first run fails")

    worker = Worker(
        redis_standalone,
        handle,
        config(queue, shards=1, reclaim_idle=1.0, max_runs=3, lease_ttl=30.0),
    )
    async with running(worker):
        await publish(redis_standalone, tasks(queue, 1), shards=1)

        async def settled() -> bool:
            return await _handled(worker, queue, 1) or bool(await _dead(redis_standalone, queue))

        await eventually(settled, within=60)

    assert await _dead(redis_standalone, queue) == []
    assert len(runs) == 2
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 1


async def _one_bad_in_a_batch(
    client: RedisClient, queue: str, add_bad: Callable[[str], Awaitable[str]]
) -> str:
    """Four healthy entries around one that ``add_bad(stream)`` adds, read as one batch.

    Run a worker until the four are handled and there is a dead letter; the bad entry's id.
    """
    await publish_shard_count(client, 1)
    seen: list[str] = []

    async def handle(message: TaskMessage) -> None:
        seen.append(message.task_id)

    healthy = tasks(queue, 4)
    await publish(client, healthy[:2], shards=1)
    bad_id = await add_bad(task_stream(queue, 0))
    await publish(client, healthy[2:], shards=1)
    worker = Worker(client, handle, config(queue, shards=1, concurrency=8))
    async with running(worker):

        async def settled() -> bool:
            return len(seen) >= 4 and await client.xlen(dead_letter_stream(queue)) >= 1

        await eventually(settled, within=30)

    assert sorted(seen) == sorted(t.task_id for t in healthy)
    assert await client.xlen(task_stream(queue, 0)) == 0
    return bad_id


async def test_a_deeply_nested_entry_is_one_dead_letter_and_its_batch_is_handled(
    redis_standalone: RedisClient, queue: str
) -> None:
    async def deep(stream: str) -> str:
        nested = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError, not ValueError
        return str(await redis_standalone.xadd(stream, {"task_id": "deep", "input": nested}))

    bad_id = await _one_bad_in_a_batch(redis_standalone, queue, deep)

    ((_, fields),) = await _dead(redis_standalone, queue)
    assert (fields["source_id"], fields["task_id"]) == (bad_id, "deep")
    assert fields["error"].startswith("malformed message: ")
    assert "nested too deeply" in fields["error"]


async def test_an_entry_with_invalid_utf8_is_one_dead_letter_with_its_bytes(
    redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    raw = Redis.from_url(redis_url)  # bytes in, bytes out

    async def not_utf8(stream: str) -> str:
        fields = {b"task_id": b"bad\xff\xfe", b"input": b"null"}
        return (await raw.xadd(stream, fields)).decode()  # type: ignore[arg-type]

    try:
        bad_id = await _one_bad_in_a_batch(redis_standalone, queue, not_utf8)
        ((_, fields),) = await raw.xrange(dead_letter_stream(queue))
    finally:
        await raw.aclose()

    assert (fields[b"source_id"].decode(), fields[b"task_id"]) == (bad_id, b"bad\xff\xfe")
    assert fields[b"error"].startswith(b"malformed message: ")
    assert b"UTF-8" in fields[b"error"]


async def test_the_same_task_id_under_two_run_ids_runs_twice(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    seen: list[tuple[str, str]] = []

    async def handle(message: TaskMessage) -> None:
        seen.append((message.run_id, message.task_id))

    (first,) = tasks(queue, 1)
    second = TaskDispatch.model_validate({**first.model_dump(), "run_id": "another-run"})
    worker = Worker(redis_standalone, handle, config(queue, shards=1))
    async with running(worker):
        await publish(redis_standalone, [first, second], shards=1)

        async def settled() -> bool:
            duplicates = await metric(
                worker, "dispatcher_worker_duplicates_suppressed_total", queue=queue
            )
            return len(seen) + duplicates >= 2

        await eventually(settled, within=30)

    assert sorted(seen) == sorted([(first.run_id, first.task_id), ("another-run", first.task_id)])


async def test_a_poison_entry_is_dead_lettered_after_exactly_max_runs(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    runs: list[int] = []

    async def handle(message: TaskMessage) -> None:
        runs.append(message.attempt)
        raise RuntimeError(f"boom #{len(runs)}")

    worker = Worker(redis_standalone, handle, config(queue, shards=1, max_runs=4))
    async with running(worker):
        (poison_id,) = await publish(redis_standalone, tasks(queue, 1), shards=1)
        await eventually(lambda: _dead(redis_standalone, queue), within=30)

    ((_, fields),) = await _dead(redis_standalone, queue)
    assert len(runs) == 4
    assert fields["runs"] == "4"
    assert fields["source_id"] == poison_id
    assert "RuntimeError: boom #4" in fields["error"]
    assert int(fields["delivery_count"]) >= 4
    assert await redis_standalone.xlen(task_stream(queue, 0)) == 0


async def test_an_async_handler_past_the_timeout_is_cancelled_and_retried(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    runs: list[str] = []
    cancelled = asyncio.Event()

    async def handle(message: TaskMessage) -> None:
        runs.append(message.task_id)
        if len(runs) == 1:
            try:
                await asyncio.Event().wait()  # never returns by itself
            except asyncio.CancelledError:
                cancelled.set()
                raise

    worker = Worker(redis_standalone, handle, config(queue, shards=1, handler_timeout=0.5))
    async with running(worker):
        await publish(redis_standalone, tasks(queue, 1), shards=1)
        await eventually(lambda: _handled(worker, queue, 1), within=30)

    assert cancelled.is_set()
    assert len(runs) == 2
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 1
    assert await _dead(redis_standalone, queue) == []


async def test_a_sync_handler_past_the_timeout_keeps_its_lease_until_its_thread_returns(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    events: list[str] = []
    started: list[float] = []
    unblock = threading.Event()

    def handle(message: TaskMessage) -> None:
        n = sum(e.startswith("start") for e in events) + 1
        events.append(f"start{n}")
        started.append(time.monotonic())
        if n == 1:
            unblock.wait(60)
        events.append(f"end{n}")

    (task,) = tasks(queue, 1)
    ttl = 2.0
    workers = [
        Worker(
            redis_standalone,
            handle,
            config(queue, shards=1, handler_timeout=0.3, lease_ttl=ttl, consumer=name),
        )
        for name in ("w1", "w2")
    ]

    async def refused_long_after_the_ttl() -> bool:
        name = "dispatcher_worker_lease_busy_total"
        busy = sum([await metric(w, name, queue=queue) for w in workers])
        return busy >= 1 and time.monotonic() - started[0] > 3 * ttl

    async with running(*workers):
        await publish(redis_standalone, [task], shards=1)
        # Retries after reclaim-idle find the lease of the live thread, renewed
        # well past its TTL.
        await eventually(lambda: bool(started), within=30)
        await eventually(refused_long_after_the_ttl, within=60)
        assert events == ["start1"]
        held = await read_attempt(redis_standalone, f"{task.run_id}:{task.task_id}:1")
        assert held is not None
        assert held.holder is not None
        assert held.lease_ms > 0
        unblock.set()
        await eventually(lambda: _handled_by_any(workers, queue), within=30)

    assert events == ["start1", "end1", "start2", "end2"]
    failed = [await metric(w, "dispatcher_worker_failed_total", queue=queue) for w in workers]
    assert sum(failed) == 1


async def _handled_by_any(workers: list[Worker], queue: str) -> bool:
    return any([await _handled(w, queue, 1) for w in workers])


async def test_runs_whose_workers_died_count_and_use_up_the_budget(
    redis_standalone: RedisClient, queue: str
) -> None:
    """Three runs started and never finished (their workers died): the entry is not run again."""
    await publish_shard_count(redis_standalone, 1)
    runs: list[str] = []

    async def handle(message: TaskMessage) -> None:
        runs.append(message.task_id)

    (task,) = tasks(queue, 1)
    await redis_standalone.set(attempt_key(f"{task.run_id}:{task.task_id}:1"), "3")
    worker = Worker(redis_standalone, handle, config(queue, shards=1, max_runs=3))
    async with running(worker):
        await publish(redis_standalone, [task], shards=1)
        await eventually(lambda: _dead(redis_standalone, queue), within=30)

    ((_, fields),) = await _dead(redis_standalone, queue)
    assert runs == []
    assert fields["runs"] == "3"
    assert fields["error"].startswith("exceeded max runs (3): the last run ended without a result")
    assert not await redis_standalone.exists(attempt_key(f"{task.run_id}:{task.task_id}:1"))
