"""Entries that wait for a queue limit: no run, no delivery-count growth, kept fresh.

Workers are ``Worker`` objects on the test's event loop, on standalone Redis
and on a 3-master Cluster (where slots are reserved before the leases).
"""

from __future__ import annotations

import asyncio
import dataclasses

from dispatcher.models import TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count, task_stream
from dispatcher.stream.limit_keys import QueueLimits, held_key, read_usage, write_limits
from dispatcher.worker import Worker
from tests.data import publish, read_attempt, tasks
from tests.waiting import eventually
from tests.workers import config, metric, running


class FirstHolds:
    """A handler that records what it ran; the first run holds its slot until ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen: list[str] = []
        self.now: list[str] = []  # running now
        self.peak = 0

    async def __call__(self, message: TaskMessage) -> None:
        self.now.append(message.task_id)
        self.peak = max(self.peak, len(self.now))
        self.seen.append(message.task_id)
        if len(self.seen) == 1:
            await self.release.wait()
        self.now.remove(message.task_id)


async def test_waiting_entries_take_no_run_and_stay_fresh_until_a_slot_frees(
    any_redis: RedisClient, queue: str
) -> None:
    """max_in_flight 1, max runs 1: a counted wait would dead-letter the entry's only run."""
    await publish_shard_count(any_redis, 1)
    await write_limits(any_redis, queue, QueueLimits(max_in_flight=1))
    handle = FirstHolds()  # its first run holds the queue's only slot
    seen = handle.seen

    settings = config(queue, shards=1, max_runs=1, reclaim_idle=0.5, lease_ttl=2.0)
    workers = [
        Worker(any_redis, handle, dataclasses.replace(settings, consumer=name)) for name in "ab"
    ]
    published = tasks(queue, 6)
    async with running(*workers):
        await publish(any_redis, published, shards=1)
        await eventually(lambda: len(seen) == 1, within=10)
        waiting = workers[0].metrics.registry, workers[1].metrics.registry

        async def all_wait() -> bool:
            name = "dispatcher_worker_limit_waiting"
            return sum(r.get_sample_value(name, {"queue": queue}) or 0 for r in waiting) == 5

        await eventually(all_wait, within=10)
        await asyncio.sleep(2.0)  # four times reclaim-idle: a stale entry would be reclaimed
        pending = await any_redis.xpending_range(
            task_stream(queue, 0), "workers", min="-", max="+", count=10
        )
        assert len(pending) == 6
        assert {p["times_delivered"] for p in pending} == {1}
        assert max(p["time_since_delivered"] for p in pending) < 500
        keys = [f"{d.run_id}:{d.task_id}:{d.attempt}" for d in published if d.task_id not in seen]
        assert [await read_attempt(any_redis, key) for key in keys] == [None] * 5  # no run
        assert (await read_usage(any_redis, queue)).in_use == 1
        handle.release.set()

        async def handled() -> bool:
            name = "dispatcher_worker_handled_total"
            return sum([await metric(w, name, queue=queue) for w in workers]) == 6

        await eventually(handled, within=20)
    assert handle.peak == 1
    assert sorted(seen) == sorted(d.task_id for d in published)
    assert await any_redis.xlen(dead_letter_stream(queue)) == 0
    assert (await read_usage(any_redis, queue)).in_use == 0


async def test_a_count_that_drifted_is_set_right_by_the_next_renewal(
    any_redis: RedisClient, queue: str
) -> None:
    """Two frees lost (say, their replies): the queue looks full until the worker renews."""
    await publish_shard_count(any_redis, 1)
    await write_limits(any_redis, queue, QueueLimits(max_in_flight=2))
    handle = FirstHolds()  # its first run holds one of the two slots throughout
    seen = handle.seen

    worker = Worker(any_redis, handle, config(queue, shards=1, lease_ttl=1.5))
    async with running(worker):
        await publish(any_redis, tasks(queue, 1), shards=1)
        await eventually(lambda: len(seen) == 1, within=10)
        (token,) = await any_redis.hkeys(held_key(queue))
        await any_redis.hincrby(held_key(queue), token, 2)
        assert (await read_usage(any_redis, queue)).in_use == 3  # full: nothing may start
        await publish(any_redis, tasks(queue, 3), shards=1)
        await eventually(lambda: len(seen) == 4, within=10)  # one at a time, beside the first
        assert (await read_usage(any_redis, queue)).in_use == 1
        handle.release.set()
    assert (await read_usage(any_redis, queue)).in_use == 0
    assert await any_redis.xlen(dead_letter_stream(queue)) == 0
