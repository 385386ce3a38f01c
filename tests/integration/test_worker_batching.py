"""Batched Redis operations of the worker on real Redis, standalone and the suite's Cluster.

One call claims a whole read batch, one group settles many entries,
``ack_many`` acks many ids of a stream in one round trip, and a read batch
comes with its slots already taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from redis.asyncio import RedisCluster

from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamConsumer, RedisStreamPublisher, task_stream
from dispatcher.stream.entries import Message
from dispatcher.worker import AttemptGuard, Claim, attempt_key
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.settle import Settler
from dispatcher.worker.slots import SlotPool
from dispatcher.worker.task_set import RedisContact
from tests.data import Attempt, hold_lease, read_attempt

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
    assert await any_redis.get(attempt_key(done)) == "done"  # claiming it changed nothing
    await mine.release(a)
    assert await guard(any_redis, owner="w2").claim_many([a, b]) == [2, Claim.BUSY]
    await any_redis.delete(*(attempt_key(key) for key in (a, b, done)))


async def test_an_attempt_is_one_key_whatever_its_state(any_redis: RedisClient, queue: str) -> None:
    mine = guard(any_redis)
    attempts = [f"{queue}-{n}:1" for n in range(4)]
    await mine.claim_many(attempts)
    await mine.release(attempts[1])
    await mine.unclaim_many(attempts[2:3])
    await mine.mark_done_many(attempts[3:])

    found = [key async for key in any_redis.scan_iter(match=f"dispatcher:*{queue}*")]

    assert sorted(found) == sorted(attempt_key(a) for a in (attempts[0], attempts[1], attempts[3]))
    leased = await read_attempt(any_redis, attempts[0])
    assert leased is not None
    assert (leased.runs, leased.holder) == (1, mine.token)
    assert leased.lease_ms > 20_000  # ours for a full TTL, by Redis's clock
    released = Attempt(runs=1, done=False, holder=None, lease_ms=0)  # the run stays counted
    assert await read_attempt(any_redis, attempts[1]) == released
    await any_redis.delete(*found)


async def test_a_claim_of_an_attempt_whose_lease_another_holds_counts_nothing(
    any_redis: RedisClient, queue: str
) -> None:
    held = f"{queue}-held:1"
    await hold_lease(any_redis, held, holder="someone else", runs=2)
    before = await any_redis.get(attempt_key(held))

    assert await guard(any_redis).claim_many([held]) == [Claim.BUSY]

    assert await any_redis.get(attempt_key(held)) == before
    await hold_lease(any_redis, held, holder="someone else", runs=2, lease_ms=-1)  # it ended
    mine = guard(any_redis)
    assert await mine.claim_many([held]) == [3]  # the holder's run counts: it started
    seen = await read_attempt(any_redis, held)
    assert seen is not None
    assert (seen.runs, seen.holder) == (3, mine.token)
    assert await any_redis.pttl(attempt_key(held)) > 30_000  # the dedup window, not the lease's
    await any_redis.delete(attempt_key(held))


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
    await hold_lease(any_redis, old, holder=mine.token, lease_ms=1000)
    await hold_lease(any_redis, lost, holder="someone else")

    await keeper.renew_due(now=loop.time() + 10)  # 10 s later: old is due
    keeper.hold(new)
    await keeper.renew_due(now=loop.time() + 10)  # new is not due yet

    renewed, taken = await read_attempt(any_redis, old), await read_attempt(any_redis, lost)
    assert renewed is not None
    assert renewed.lease_ms > 20_000
    assert len(keeper) == 2  # the lost lease is no longer renewed
    assert taken is not None
    assert taken.holder == "someone else"
    keeper.drop(handles[0])
    assert len(keeper) == 1
    await any_redis.delete(*(attempt_key(k) for k in (old, new, lost)))


async def test_a_read_holds_no_slot_and_reads_ahead_only_after_quick_handlers(
    any_redis: RedisClient, queue: str
) -> None:
    consumer = await filled(any_redis, task_stream(queue, 0), 20)
    slots = SlotPool(4)
    stopping = asyncio.Event()
    batches: list[tuple[int, int]] = []

    class Deliveries:
        async def take(self, reader: StreamReader, batch: Sequence[Message]) -> None:
            batches.append((len(batch), slots.held))
            reader.inline = True  # as if its handlers had all finished in their first step
            if len(batches) == 2:
                stopping.set()

    reader = StreamReader(
        consumer=consumer,
        queue=queue,
        slots=slots,
        deliveries=Deliveries(),
        stopping=stopping,
        reclaim_idle_ms=1000,
        contact=RedisContact(time.monotonic),
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

    assert not await any_redis.exists(attempt_key(once))
    assert await any_redis.get(attempt_key(twice)) == "1"  # its first run stays counted
    theirs = await read_attempt(any_redis, other)
    assert theirs is not None
    assert theirs.runs == 1
    assert theirs.holder not in (None, mine.token)
    assert await guard(any_redis, owner="w3").claim_many([once, twice, other]) == [1, 2, Claim.BUSY]
    await any_redis.delete(*(attempt_key(key) for key in (once, twice, other)))


async def test_on_cluster_a_node_that_lost_the_scripts_gets_them_again(
    redis_cluster: RedisClient, queue: str
) -> None:
    """A failed-over or new primary knows no script: the claim loads it there and goes on."""
    mine = guard(redis_cluster)
    first, then = [f"{queue}-{n}:1" for n in range(20)], [f"{queue}-{n}:1" for n in range(20, 40)]
    assert await mine.claim_many(first) == [1] * 20
    await redis_cluster.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)

    assert await mine.claim_many([*first, *then]) == [Claim.BUSY] * 20 + [1] * 20
    await mine.unclaim_many(then)
    assert await mine.claim_many(then) == [1] * 20  # given back: nothing counted
    await redis_cluster.delete(*(attempt_key(key) for key in [*first, *then]))
