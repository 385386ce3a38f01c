"""Batched Redis operations of the worker on real Redis, standalone and the suite's Cluster.

One call claims a whole read batch, one group settles many entries,
``ack_many`` acks many ids of a stream in one round trip, and a read batch
comes with its slots already taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamConsumer, RedisStreamPublisher, task_stream
from dispatcher.stream.entries import Message
from dispatcher.worker import AttemptGuard, Claim, attempt_key, lease_key
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.settle import Settler
from dispatcher.worker.slots import SlotPool

GROUP = "workers"


def guard(client: RedisClient, *, owner: str = "w1") -> AttemptGuard:
    return AttemptGuard(client, owner=owner, lease_ttl_ms=30_000, done_ttl_ms=60_000)


async def filled(client: RedisClient, stream: str, count: int) -> RedisStreamConsumer:
    consumer = RedisStreamConsumer(
        client=client, stream=stream, group=GROUP, consumer="c1", block_ms=50
    )
    await consumer.setup()
    await RedisStreamPublisher(client).publish_many([(stream, {"n": str(i)}) for i in range(count)])
    return consumer


async def test_ack_many_acks_and_deletes_only_the_given_ids(
    any_redis: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    consumer = await filled(any_redis, stream, 5)
    messages = await consumer.read_new(10)

    await consumer.ack_many([m.id for m in messages[:3]])
    await consumer.ack_many([])

    assert await consumer.pending_count() == 2
    assert [entry_id for entry_id, _ in await any_redis.xrange(stream)] == [
        m.id for m in messages[3:]
    ]


async def test_claim_many_takes_each_attempt_once_and_sees_done_marks(
    any_redis: RedisClient, queue: str
) -> None:
    a, b, done = (f"{queue}-{name}:1" for name in ("a", "b", "done"))
    mine = guard(any_redis)
    await mine.mark_done_many([done])

    claims = await mine.claim_many([a, b, a, done])

    assert claims == [1, 1, Claim.BUSY, Claim.DONE]  # runs 1 of a and b
    assert await guard(any_redis, owner="w2").claim_many([a, b]) == [Claim.BUSY, Claim.BUSY]
    assert not await any_redis.exists(lease_key(done))  # taken, then let go: it is done
    await mine.release(a)
    assert await guard(any_redis, owner="w2").claim_many([a, b]) == [2, Claim.BUSY]
    await any_redis.delete(*(k(key) for key in (a, b, done) for k in (lease_key, attempt_key)))


async def test_a_claim_of_an_uncounted_attempt_whose_lease_is_held_counts_nothing(
    any_redis: RedisClient, queue: str
) -> None:
    held = f"{queue}-held:1"
    await any_redis.set(lease_key(held), "someone else", px=30_000)  # no run count yet

    assert await guard(any_redis).claim_many([held]) == [Claim.BUSY]

    assert not await any_redis.exists(attempt_key(held))
    assert await any_redis.get(lease_key(held)) == "someone else"
    await any_redis.delete(lease_key(held))
    assert await guard(any_redis).claim_many([held]) == [1]
    assert await any_redis.pttl(attempt_key(held)) > 30_000  # the dedup window, not the lease's
    await any_redis.delete(lease_key(held), attempt_key(held))


async def test_settle_writes_done_marks_then_acks_entries_of_many_streams(
    any_redis: RedisClient, queue: str
) -> None:
    keeper = guard(any_redis)
    settler = Settler(any_redis, keeper)
    consumers = [await filled(any_redis, task_stream(queue, shard), 3) for shard in (0, 1)]
    read = [(c, m) for c in consumers for m in await c.read_new(10)]

    await asyncio.gather(
        *(settler.settle(c, m.id, done=f"{c.stream}-{m.id}:1") for c, m in read[:4]),
        *(settler.settle(c, m.id) for c, m in read[4:]),  # duplicates: ack only
    )

    for consumer in consumers:
        assert await any_redis.xlen(consumer.stream) == 0
        assert await consumer.pending_count() == 0
    # Keyed by stream too: two streams can hand out the same entry id.
    marks = [attempt_key(f"{c.stream}-{m.id}:1") for c, m in read]
    assert [bool(await any_redis.exists(k)) for k in marks] == [True] * 4 + [False] * 2
    await any_redis.delete(*marks[:4])


async def test_a_failed_group_fails_every_waiter_and_the_next_group_is_fresh(
    redis_standalone: RedisClient, queue: str
) -> None:
    stream = task_stream(queue, 0)
    consumer = await filled(redis_standalone, stream, 2)
    first, second = await consumer.read_new(10)
    await redis_standalone.set(stream + ".blocker", "x")
    broken = RedisStreamConsumer(
        client=redis_standalone, stream=stream + ".blocker", group=GROUP, consumer="c1"
    )
    settler = Settler(redis_standalone, guard(redis_standalone))

    results = await asyncio.gather(
        settler.settle(consumer, first.id, done=f"{queue}:1"),
        settler.settle(broken, "1-1"),  # XACK on a string key: WRONGTYPE
        return_exceptions=True,
    )
    await settler.settle(consumer, second.id)

    assert [type(r).__name__ for r in results] == ["ResponseError", "ResponseError"]
    assert await redis_standalone.exists(attempt_key(f"{queue}:1"))  # written before its ack
    assert await consumer.pending_count() == 0


async def test_the_keeper_renews_only_leases_held_a_third_of_the_ttl(
    any_redis: RedisClient, queue: str
) -> None:
    mine = guard(any_redis)
    keeper = LeaseKeeper(mine, reclaim_idle=30.0)
    old, new, lost = (f"{queue}-{name}:1" for name in ("old", "new", "lost"))
    await mine.claim_many([old, new, lost])
    loop = asyncio.get_running_loop()
    handles = [keeper.hold(key) for key in (old, lost)]
    await any_redis.pexpire(lease_key(old), 1000)
    await any_redis.set(lease_key(lost), "someone else")

    await keeper.renew_due(now=loop.time() + 10)  # 10 s later: old is due
    keeper.hold(new)
    await keeper.renew_due(now=loop.time() + 10)  # new is not due yet

    assert await any_redis.pttl(lease_key(old)) > 20_000  # pushed a full TTL ahead
    assert len(keeper) == 2  # the lost lease is no longer renewed
    assert await any_redis.get(lease_key(lost)) == "someone else"
    keeper.drop(handles[0])
    assert len(keeper) == 1
    await any_redis.delete(*(lease_key(k) for k in (old, new, lost)))


async def test_a_read_holds_no_slot_and_reads_ahead_only_after_quick_handlers(
    any_redis: RedisClient, queue: str
) -> None:
    consumer = await filled(any_redis, task_stream(queue, 0), 20)
    slots = SlotPool(4)
    stopping = asyncio.Event()
    batches: list[tuple[int, int]] = []

    async def submit(reader: StreamReader, batch: Sequence[Message]) -> None:
        batches.append((len(batch), slots.held))
        reader.inline = True  # as if its handlers had all finished in their first step
        if len(batches) == 2:
            stopping.set()

    reader = StreamReader(
        consumer=consumer,
        queue=queue,
        slots=slots,
        submit=submit,
        stopping=stopping,
        reclaim_idle_ms=1000,
        on_redis_ok=lambda: None,
    )
    await asyncio.wait_for(reader.read_loop(), 30)

    assert batches == [(4, 0), (16, 0)]  # as many as slots are free, then the read-ahead


async def test_an_unclaimed_attempt_is_free_again_without_a_counted_run(
    any_redis: RedisClient, queue: str
) -> None:
    once, twice, other = (f"{queue}-{name}:1" for name in ("once", "twice", "other"))
    mine = guard(any_redis)
    await mine.claim_many([twice])
    await mine.release(twice)
    assert await mine.claim_many([once, twice]) == [1, 2]
    await guard(any_redis, owner="w2").claim_many([other])

    await mine.unclaim_many([once, twice, other])  # other's lease is not ours: untouched

    assert not await any_redis.exists(lease_key(once), attempt_key(once), lease_key(twice))
    assert await any_redis.get(attempt_key(twice)) == "1"
    assert await any_redis.get(attempt_key(other)) == "1"
    assert await guard(any_redis, owner="w3").claim_many([once, twice, other]) == [1, 2, Claim.BUSY]
    await any_redis.delete(
        *(k(key) for key in (once, twice, other) for k in (lease_key, attempt_key))
    )
