"""The shard key's owner marker on a real Redis: claimed once, taken over only when unchanged,
released only by its owner."""

from __future__ import annotations

from dispatcher.controller.identity import Owner
from dispatcher.controller.redis_access import measure
from dispatcher.controller.shard_owner import (
    SHARDS_OWNER_KEY,
    ShardKeyOwner,
    claim,
    judge,
    release,
    take_over,
)
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import SHARDS_KEY

A = Owner(name="orders", namespace="shop", uid="u-a")
B = Owner(name="payments", namespace="shop", uid="u-b")
C = Owner(name="billing", namespace="shop", uid="u-c")


async def test_the_first_claim_wins_and_only_the_owner_releases(
    redis_standalone: RedisClient,
) -> None:
    assert await claim(redis_standalone, me=A)
    assert await claim(redis_standalone, me=A)  # again: still ours
    assert not await claim(redis_standalone, me=B)
    assert not await release(redis_standalone, me=B)
    assert await redis_standalone.get(SHARDS_OWNER_KEY) == ShardKeyOwner.of(A).text()
    assert await release(redis_standalone, me=A)
    assert await redis_standalone.get(SHARDS_OWNER_KEY) is None
    assert await claim(redis_standalone, me=B)


async def test_a_stale_marker_is_taken_over_only_as_it_was_read(
    redis_standalone: RedisClient,
) -> None:
    assert await claim(redis_standalone, me=A)
    stale = ShardKeyOwner.of(A)
    assert await take_over(redis_standalone, me=B, stale=stale)
    # C read A's marker too, but B replaced it meanwhile: C takes nothing.
    assert not await take_over(redis_standalone, me=C, stale=stale)
    assert await redis_standalone.get(SHARDS_OWNER_KEY) == ShardKeyOwner.of(B).text()


async def test_garbage_in_the_marker_is_neither_claimed_nor_released(
    redis_standalone: RedisClient,
) -> None:
    await redis_standalone.set(SHARDS_OWNER_KEY, b"\xffgarbage")
    assert not await claim(redis_standalone, me=A)
    assert not await release(redis_standalone, me=A)
    assert await redis_standalone.strlen(SHARDS_OWNER_KEY) == len(b"\xffgarbage")


async def test_the_measuring_round_trip_reads_a_marker_that_is_not_text_as_unreadable(
    redis_standalone: RedisClient,
) -> None:
    await redis_standalone.set(SHARDS_KEY, "3")
    measured = await measure(redis_standalone, queues=["q"], shards=1)
    assert (measured.published, judge(measured.owner, me=A)) == (3, ("free", None))
    await redis_standalone.set(SHARDS_OWNER_KEY, b"\xff\xfe")
    measured = await measure(redis_standalone, queues=["q"], shards=1)
    assert (measured.published, judge(measured.owner, me=A)) == (3, ("unreadable", None))
    assert await redis_standalone.get(SHARDS_KEY) == "3"  # the connection still answers
