"""Async handlers started inline in their read batch, on real Redis.

A batch's handlers start one after the other in the batch's task; one that
waits must hold only its own slot, and each handler must still see a task
and a context of its own, as if it had been awaited in a task alone.
"""

from __future__ import annotations

import asyncio
import contextvars
import json

from dispatcher.models import TaskDispatch, TaskMessage, payload_fields
from dispatcher.redis_client import RedisClient
from dispatcher.stream import publish_shard_count, task_stream
from dispatcher.worker import Worker
from tests.data import publish, read_attempt, tasks
from tests.waiting import eventually
from tests.workers import config, metric, running

_SEEN_BY_EARLIER: contextvars.ContextVar[str | None] = contextvars.ContextVar("seen", default=None)


def _key(task: TaskDispatch) -> str:
    return f"{task.run_id}:{task.task_id}:1"


async def _handled(worker: Worker, queue: str, count: int) -> bool:
    return await metric(worker, "dispatcher_worker_handled_total", queue=queue) >= count


async def test_a_slow_handler_in_a_batch_holds_one_slot_and_the_rest_flow(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    slow, *rest = tasks(queue, 4)
    later = tasks(queue, 12)
    release = asyncio.Event()
    seen: list[str] = []

    async def handle(message: TaskMessage) -> None:
        if message.task_id == slow.task_id:
            await release.wait()
        seen.append(message.task_id)

    worker = Worker(redis_standalone, handle, config(queue, shards=1, concurrency=4))
    await publish(redis_standalone, [slow, *rest], shards=1)  # one batch of 4: all slots
    async with running(worker):
        await eventually(lambda: _handled(worker, queue, 3), within=30)
        await publish(redis_standalone, later, shards=1)  # read into the 3 free slots
        await eventually(lambda: _handled(worker, queue, 15), within=30)
        assert slow.task_id not in seen
        assert worker.metrics.running == 1
        release.set()
        await eventually(lambda: _handled(worker, queue, 16), within=30)

    assert sorted(seen) == sorted(t.task_id for t in [slow, *rest, *later])


async def test_each_handler_of_a_batch_has_its_own_context_and_task(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    waits, *rest = tasks(queue, 6)
    leaked: list[str] = []
    timed_out: list[str] = []

    async def handle(message: TaskMessage) -> None:
        if (earlier := _SEEN_BY_EARLIER.get()) is not None:
            leaked.append(earlier)
        _SEEN_BY_EARLIER.set(message.task_id)
        if message.task_id == waits.task_id:
            # Entered before the handler first waits: it must cancel this run, not its batch.
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.sleep(30)
            except TimeoutError:
                timed_out.append(message.task_id)

    worker = Worker(redis_standalone, handle, config(queue, shards=1, concurrency=8))
    await publish(redis_standalone, [waits, *rest], shards=1)  # one batch
    async with running(worker):
        await eventually(lambda: _handled(worker, queue, 6), within=30)

    assert leaked == []
    assert timed_out == [waits.task_id]


async def test_entries_waiting_for_a_slot_at_stop_are_given_back_uncounted(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    quick, slow, *waiting = tasks(queue, 4)
    started = asyncio.Event()
    seen: list[str] = []

    async def handle(message: TaskMessage) -> None:
        seen.append(message.task_id)
        if message.task_id == slow.task_id:
            started.set()
            await asyncio.Event().wait()  # outlives the grace period

    worker = Worker(
        redis_standalone, handle, config(queue, shards=1, concurrency=1, grace_period=0.5)
    )
    async with running(worker):
        await publish(redis_standalone, [quick], shards=1)  # finishes inline: read ahead next
        await eventually(lambda: _handled(worker, queue, 1), within=30)
        async with redis_standalone.pipeline(transaction=True) as multi:  # one read, one slot
            for n, task in enumerate([slow, *waiting]):
                multi.xadd(
                    task_stream(queue, 0), payload_fields(json.dumps(task.payload()), str(n))
                )
            await multi.execute()
        await asyncio.wait_for(started.wait(), 30)

    assert seen == [quick.task_id, slow.task_id]
    seen_keys = [await read_attempt(redis_standalone, _key(t)) for t in [slow, *waiting]]
    # The two that never started left no key: no run counted, no lease held.
    assert [a.runs if a else None for a in seen_keys] == [1, None, None]
    assert await redis_standalone.xlen(task_stream(queue, 0)) == 3  # all three stay pending
