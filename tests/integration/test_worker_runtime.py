"""The worker runtime in-process against real Redis, standalone and the suite's Cluster.

Workers are ``Worker`` objects on the test's event loop, each with its own
metrics registry; handlers record what they saw in memory.
"""

from __future__ import annotations

import asyncio
import collections

import pytest

from dispatcher.models import TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count, queue_streams, task_stream
from dispatcher.stream.stats import stream_stats
from dispatcher.worker import Worker, attempt_key
from tests.data import GROUP, publish, tasks
from tests.waiting import eventually
from tests.workers import config, metric, recorder, running


async def test_two_workers_handle_every_task_exactly_once(
    any_redis: RedisClient, queue: str
) -> None:
    await publish_shard_count(any_redis, 4)
    seen: list[str] = []
    workers = [
        Worker(any_redis, recorder(seen), config(queue, consumer=name)) for name in ("w1", "w2")
    ]
    published = tasks(queue, 5000)

    async with running(*workers):
        await publish(any_redis, published, shards=4)
        await eventually(lambda: _settled(seen, 5000), within=60)

    counts = collections.Counter(seen)
    assert set(counts) == {t.task_id for t in published}
    assert set(counts.values()) == {1}
    for stream in queue_streams([queue], 4):
        stats = await stream_stats(any_redis, stream, GROUP)
        assert (stats.length, stats.pending, stats.consumers) == (0, 0, 0)  # left the group
    handled = [await metric(w, "dispatcher_worker_handled_total", queue=queue) for w in workers]
    assert sum(handled) == 5000


async def _settled(seen: list[str], count: int) -> bool:
    return len(seen) >= count


async def test_a_failing_task_is_dead_lettered_and_others_flow(
    any_redis: RedisClient, queue: str
) -> None:
    await publish_shard_count(any_redis, 4)
    poison, *healthy = tasks(queue, 20)
    seen: list[str] = []

    def handle(message: TaskMessage) -> None:  # sync: runs in a thread
        if message.task_id == poison.task_id:
            raise RuntimeError("boom: cannot handle this one")
        seen.append(message.task_id)

    worker = Worker(any_redis, handle, config(queue))
    async with running(worker):
        (poison_id, *_) = await publish(any_redis, [poison, *healthy], shards=4)
        dead = await eventually(lambda: any_redis.xrange(dead_letter_stream(queue)), within=30)
        await eventually(lambda: _settled(seen, len(healthy)))

    assert sorted(seen) == sorted(t.task_id for t in healthy)
    ((_, fields),) = dead
    assert fields["task_id"] == poison.task_id
    assert fields["source_stream"] == task_stream(queue, _shard_of(poison.task_id))
    assert fields["source_id"] == poison_id
    assert fields["runs"] == "3"  # max_runs=3: given up after the third failed run
    assert fields["delivery_count"] == "3"
    assert fields["error"].startswith("failed 3 runs (max runs 3); last error: ")
    assert "RuntimeError: boom: cannot handle this one" in fields["error"]
    assert fields["outbox_id"] == "1"
    assert await any_redis.xlen(fields["source_stream"]) == 0  # acked and deleted
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 3
    assert (
        await metric(
            worker, "dispatcher_worker_dead_lettered_total", queue=queue, reason="max_runs"
        )
        == 1
    )


def _shard_of(task_id: str) -> int:
    from dispatcher.stream import shard_for

    return shard_for(task_id, 4)


async def test_a_malformed_entry_is_dead_lettered_at_once(
    any_redis: RedisClient, queue: str
) -> None:
    await publish_shard_count(any_redis, 4)
    seen: list[str] = []
    worker = Worker(any_redis, recorder(seen), config(queue))
    stream = task_stream(queue, 2)
    async with running(worker):
        bad_id = await any_redis.xadd(stream, {"task_id": "x", "input": "{not json"})
        dead = await eventually(lambda: any_redis.xrange(dead_letter_stream(queue)))
        good = tasks(queue, 5)
        await publish(any_redis, good, shards=4)
        await eventually(lambda: _settled(seen, 5))

    ((_, fields),) = dead
    assert fields["source_id"] == bad_id
    assert fields["source_stream"] == stream
    assert fields["delivery_count"] == "1"
    assert fields["error"].startswith("malformed message: field 'input' is not valid JSON")
    assert fields["input"] == "{not json"
    assert sorted(seen) == sorted(t.task_id for t in good)


async def test_the_same_task_published_twice_runs_once(any_redis: RedisClient, queue: str) -> None:
    await publish_shard_count(any_redis, 4)
    seen: list[str] = []
    worker = Worker(any_redis, recorder(seen), config(queue))
    twice = tasks(queue, 10)
    marker = tasks(queue, 1, prefix="marker")
    async with running(worker):
        await publish(any_redis, twice, shards=4)
        await eventually(lambda: _settled(seen, 10))
        await publish(any_redis, [*twice, *marker], shards=4)  # the duplicates, then a marker
        await eventually(lambda: _duplicates(worker, queue, 10))
        await eventually(lambda: _settled(seen, 11))

    assert sorted(seen) == sorted(t.task_id for t in [*twice, *marker])
    (first, *_) = twice
    assert await any_redis.get(attempt_key(f"{first.run_id}:{first.task_id}:1")) == "done"
    for stream in queue_streams([queue], 4):
        assert await any_redis.xlen(stream) == 0


async def _duplicates(worker: Worker, queue: str, count: int) -> bool:
    return (
        await metric(worker, "dispatcher_worker_duplicates_suppressed_total", queue=queue) >= count
    )


async def test_concurrent_duplicates_never_run_together(
    redis_standalone: RedisClient, queue: str
) -> None:
    """Two deliveries of one attempt at once: one runs, the other waits, then is acked."""
    await publish_shard_count(redis_standalone, 1)
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def handle(message: TaskMessage) -> None:
        runs.append(message.task_id)
        started.set()
        await release.wait()

    worker = Worker(redis_standalone, handle, config(queue, shards=1))
    (task,) = tasks(queue, 1)
    async with running(worker):
        await publish(redis_standalone, [task, task], shards=1)
        await asyncio.wait_for(started.wait(), 10)
        await eventually(lambda: metric(worker, "dispatcher_worker_lease_busy_total", queue=queue))
        release.set()
        await eventually(lambda: _duplicates(worker, queue, 1))

    assert runs == [task.task_id]
    assert await redis_standalone.xlen(task_stream(queue, 0)) == 0


async def test_new_shards_are_read_without_restart(any_redis: RedisClient, queue: str) -> None:
    await publish_shard_count(any_redis, 4)
    seen: list[str] = []
    worker = Worker(any_redis, recorder(seen), config(queue))
    published = tasks(queue, 200)
    on_new_shards = [t for t in published if _shard(t.task_id, 8) >= 4]
    assert on_new_shards
    async with running(worker):
        assert sorted(worker.streams) == sorted(queue_streams([queue], 4))
        await publish(any_redis, published, shards=8)
        await publish_shard_count(any_redis, 8)
        await eventually(lambda: _settled(seen, 200), within=30)

    assert sorted(worker.streams) == sorted(queue_streams([queue], 8))
    assert sorted(seen) == sorted(t.task_id for t in published)
    await publish_shard_count(any_redis, 4)  # the Cluster is shared by the session


def _shard(task_id: str, shards: int) -> int:
    from dispatcher.stream import shard_for

    return shard_for(task_id, shards)


async def test_backlog_gauges_follow_the_streams(redis_standalone: RedisClient, queue: str) -> None:
    await publish_shard_count(redis_standalone, 1)
    release = asyncio.Event()

    async def handle(message: TaskMessage) -> None:
        await release.wait()

    worker = Worker(redis_standalone, handle, config(queue, shards=1, concurrency=2))
    stream = task_stream(queue, 0)
    async with running(worker):
        await publish(redis_standalone, tasks(queue, 5), shards=1)
        await eventually(lambda: _gauge(worker, queue, stream, 5, 2))
        release.set()
        await eventually(lambda: _gauge(worker, queue, stream, 0, 0))


async def _gauge(worker: Worker, queue: str, stream: str, length: int, pending: int) -> bool:
    labels = {"queue": queue, "stream": stream}
    got_length = await metric(worker, "dispatcher_worker_stream_length", **labels)
    got_pending = await metric(worker, "dispatcher_worker_stream_pending", **labels)
    return (got_length, got_pending) == (length, pending)


@pytest.mark.parametrize("stuck", [False, True])
async def test_stop_leaves_the_group_only_with_nothing_pending(
    redis_standalone: RedisClient, queue: str, stuck: bool
) -> None:
    await publish_shard_count(redis_standalone, 1)
    stream = task_stream(queue, 0)
    seen: list[str] = []
    never = asyncio.Event()

    async def handle(message: TaskMessage) -> None:
        seen.append(message.task_id)
        if stuck and message.node_id == "n0":
            await never.wait()  # outlives the grace period: cancelled, stays pending

    worker = Worker(
        redis_standalone, handle, config(queue, shards=1, consumer="me", grace_period=0.2)
    )
    async with running(worker):
        await publish(redis_standalone, tasks(queue, 3), shards=1)
        await eventually(lambda: _settled(seen, 3))

    consumers = await redis_standalone.xinfo_consumers(stream, GROUP)
    assert [(c["name"], c["pending"]) for c in consumers] == ([("me", 1)] if stuck else [])


async def test_probes_and_metrics_are_served(redis_standalone: RedisClient, queue: str) -> None:
    import aiohttp

    from dispatcher.demo.throwaway import free_port
    from dispatcher.observability import ObservabilityServer

    seen: list[str] = []
    worker = Worker(redis_standalone, recorder(seen), config(queue, shards=1))
    server = ObservabilityServer(
        port=free_port(),
        host="127.0.0.1",
        live=worker.live,
        ready=worker.ready,
        registry=worker.metrics.registry,
    )
    base = f"http://127.0.0.1:{server.port}"
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"{base}/healthz")).status == 503  # not started yet
            async with running(worker):
                await publish(redis_standalone, tasks(queue, 3), shards=1)
                await eventually(lambda: _handled(worker, queue, 3))
                assert (await http.get(f"{base}/healthz")).status == 200
                assert (await http.get(f"{base}/readyz")).status == 200
                body = await (await http.get(f"{base}/metrics")).text()
    finally:
        await server.stop()
    assert f'dispatcher_worker_handled_total{{queue="{queue}"}} 3.0' in body
    assert "dispatcher_worker_handler_seconds_bucket" in body


async def _handled(worker: Worker, queue: str, count: int) -> bool:
    return await metric(worker, "dispatcher_worker_handled_total", queue=queue) >= count
