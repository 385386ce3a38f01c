"""Consumer-group semantics on real Redis, standalone and the suite's 3-master Cluster."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from dispatcher.redis_client import RedisClient
from dispatcher.stream import (
    RedisStreamConsumer,
    RedisStreamPublisher,
    queue_streams,
    task_stream,
)
from tests.waiting import eventually

GROUP = "workers"


def consumer(client: RedisClient, stream: str, name: str, **kw: int) -> RedisStreamConsumer:
    return RedisStreamConsumer(client=client, stream=stream, group=GROUP, consumer=name, **kw)


async def drain(c: RedisStreamConsumer) -> list[str]:
    seen: list[str] = []
    while batch := await c.read_new(50):
        seen.extend(m.fields["n"] for m in batch)
    return seen


async def test_each_message_goes_to_exactly_one_consumer(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    a, b = (
        consumer(any_redis, stream, "a", block_ms=50),
        consumer(any_redis, stream, "b", block_ms=50),
    )
    await a.setup()
    await b.setup()  # an existing group is success
    await RedisStreamPublisher(any_redis).publish_many(
        [(stream, {"n": str(i)}) for i in range(300)]
    )

    got_a, got_b = await asyncio.gather(drain(a), drain(b))

    assert not set(got_a) & set(got_b)
    assert sorted(got_a + got_b, key=int) == [str(i) for i in range(300)]


async def test_message_stays_pending_until_acked_and_ack_deletes_it(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 1)
    c = consumer(any_redis, stream, "c1", block_ms=50)
    await c.setup()
    await RedisStreamPublisher(any_redis).publish(stream, {"n": "1"})

    (msg,) = await c.read_new(10)
    assert msg.fields == {"n": "1"}
    assert msg.delivery_count == 1
    assert await c.pending_count() == 1
    assert await c.read_new(10) == []  # not handed out twice

    await c.ack(msg.id)

    assert await c.pending_count() == 0
    assert (await any_redis.xpending(stream, GROUP))["pending"] == 0
    assert await any_redis.xlen(stream) == 0


async def test_unacked_message_is_reclaimed_by_another_consumer(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 2)
    crashed, rescuer = (
        consumer(any_redis, stream, "crashed"),
        consumer(any_redis, stream, "rescuer"),
    )
    await crashed.setup()
    await RedisStreamPublisher(any_redis).publish(stream, {"n": "7"})
    (first,) = await crashed.read_new(1)

    assert await rescuer.reclaim_orphaned(min_idle_ms=60_000) == []  # not idle long enough
    reclaimed = await eventually(lambda: rescuer.reclaim_orphaned(min_idle_ms=100))

    assert [(m.id, m.fields, m.delivery_count) for m in reclaimed] == [(first.id, {"n": "7"}, 2)]
    assert await crashed.pending_count() == 0
    assert await rescuer.pending_count() == 1


async def test_reclaim_follows_the_cursor_and_counts_every_message(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    crashed = consumer(any_redis, stream, "crashed")
    rescuer = consumer(any_redis, stream, "rescuer", reclaim_batch=7, reclaim_limit=1000)
    await crashed.setup()
    await RedisStreamPublisher(any_redis).publish_many([(stream, {"n": str(i)}) for i in range(40)])
    assert len(await crashed.read_new(40)) == 40

    reclaimed = await eventually(lambda: rescuer.reclaim_orphaned(min_idle_ms=100))

    assert sorted(int(m.fields["n"]) for m in reclaimed) == list(range(40))
    assert {m.delivery_count for m in reclaimed} == {2}


async def test_reclaiming_an_entry_deleted_meanwhile_does_not_crash(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 3)
    crashed, rescuer = (
        consumer(any_redis, stream, "crashed"),
        consumer(any_redis, stream, "rescuer"),
    )
    await crashed.setup()
    publisher = RedisStreamPublisher(any_redis)
    await publisher.publish_many([(stream, {"n": "gone"}), (stream, {"n": "kept"})])
    gone, kept = await crashed.read_new(2)
    await any_redis.xdel(stream, gone.id)

    reclaimed = await eventually(lambda: rescuer.reclaim_orphaned(min_idle_ms=100))

    assert [m.id for m in reclaimed] == [kept.id]
    pending = await any_redis.xpending_range(stream, GROUP, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [kept.id]  # the deleted one left the PEL


async def test_read_new_returns_empty_on_timeout(any_redis: RedisClient, queue: str) -> None:
    c = consumer(any_redis, task_stream(queue, 0), "idle", block_ms=20)
    await c.setup()
    assert await c.read_new(5) == []


async def test_an_entry_that_is_not_utf8_marks_only_itself_and_none_is_lost(
    redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    c = consumer(redis_standalone, stream, "c1", block_ms=50)
    await c.setup()
    publisher = RedisStreamPublisher(redis_standalone)
    raw = Redis.from_url(redis_url)  # bytes in, bytes out
    try:
        await publisher.publish_many([(stream, {"n": "1"}), (stream, {"n": "2"})])
        held = await c.read_new(2)  # still pending: never handed out again
        await publisher.publish(stream, {"n": "3"})
        bad = (await raw.xadd(stream, {b"n": b"\xff4"})).decode()  # type: ignore[dict-item]
        await publisher.publish(stream, {"n": "5"})
        batch = await c.read_new(10)
        await publisher.publish(stream, {"n": "6"})
        later = await c.read_new(10)
    finally:
        await raw.aclose()

    assert [m.fields["n"] for m in held] == ["1", "2"]
    assert [(m.id == bad, m.error is None) for m in batch] == [
        (False, True),
        (True, False),
        (False, True),
    ]
    assert [m.fields["n"] for m in batch] == ["3", "\udcff4", "5"]  # as surrogate escapes
    assert [m.fields["n"] for m in later] == ["6"]
    assert await c.pending_count() == 6


async def test_a_client_that_does_not_decode_reads_the_same_messages(
    redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    raw = Redis.from_url(redis_url)
    try:
        c = consumer(raw, stream, "c1", block_ms=50)
        await c.setup()
        await RedisStreamPublisher(redis_standalone).publish(stream, {"n": "1", "é": "ü"})
        (message,) = await c.read_new(10)
    finally:
        await raw.aclose()

    assert (message.fields, message.error) == ({"n": "1", "é": "ü"}, None)


async def test_ack_errors_are_raised_not_swallowed(any_redis: RedisClient, queue: str) -> None:
    stream = task_stream(queue, 0)
    await any_redis.set(stream, "not a stream")
    c = consumer(any_redis, stream, "x")
    with pytest.raises(Exception, match="WRONGTYPE"):
        await c.ack("1-1")


async def test_publish_many_reports_each_entry(any_redis: RedisClient, queue: str) -> None:
    good, bad = task_stream(queue, 0), task_stream(queue, 1)
    await any_redis.set(bad, "not a stream")
    results = await RedisStreamPublisher(any_redis).publish_many(
        [(good, {"n": "1"}), (bad, {"n": "2"}), (good, {"n": "3"})]
    )
    assert [r.ok for r in results] == [True, False, True]
    assert "WRONGTYPE" in str(results[1].error)
    assert await any_redis.xlen(good) == 2


async def test_publisher_creates_the_group_before_the_first_entry(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    await RedisStreamPublisher(any_redis, group=GROUP).publish(stream, {"n": "early"})
    late = consumer(any_redis, stream, "late", block_ms=20)
    await late.setup()  # the group exists already, at 0: the early entry is not skipped
    assert [m.fields["n"] for m in await late.read_new(10)] == ["early"]


@pytest.mark.cluster
async def test_shards_of_a_queue_spread_over_cluster_nodes(redis_cluster: RedisClient) -> None:
    from redis.asyncio import RedisCluster

    assert isinstance(redis_cluster, RedisCluster)
    nodes = {redis_cluster.get_node_from_key(s).name for s in queue_streams(["http"], 4)}
    assert len(nodes) > 1, nodes
    assert len(redis_cluster.get_primaries()) == 3
