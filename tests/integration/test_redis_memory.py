"""A real Redis with maxmemory: the gate's readings, and workers starting on a full Redis."""

from __future__ import annotations

import pytest
import redis as sync_redis
from redis.exceptions import ResponseError

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.outbox.backpressure import MemoryMarks, RedisMemoryGate
from dispatcher.redis_client import RedisClient, check_eviction_policy, connect_redis
from dispatcher.stream.publisher import ensure_group


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def small_redis(redis_process: RedisProcess) -> RedisProcess:
    redis_process.cli("CONFIG", "SET", "maxmemory", "16mb")
    redis_process.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
    return redis_process


def _fill(server: RedisProcess, megabytes: int) -> None:
    """About ``megabytes`` MB of ballast keys."""
    with sync_redis.Redis(port=server.port) as client:
        for i in range(megabytes * 4):
            client.set(f"ballast:{i}", b"x" * 250_000)  # within one 256 KiB allocation


async def test_the_gate_pauses_above_high_and_resumes_below_low(small_redis: RedisProcess) -> None:
    client = connect_redis(small_redis.url)
    clock = Clock()
    gate = RedisMemoryGate(client, marks=MemoryMarks(0.85, 0.75), check_every=1.0, clock=clock)
    try:
        assert await gate.allows()
        _fill(small_redis, 14)  # ~15 MB of 16: above 85 %
        assert await gate.allows(), "read at most once a second"
        clock.now += 1.0
        assert not await gate.allows()
        assert gate.paused
        assert gate.ratio >= 0.85

        small_redis.cli("DEL", *(f"ballast:{i}" for i in range(3)))
        clock.now += 1.0
        assert not await gate.allows(), "still above the low mark"
        small_redis.cli("FLUSHALL")
        clock.now += 1.0
        assert await gate.allows()
    finally:
        await client.aclose()


async def test_published_bytes_bring_the_next_reading_forward(small_redis: RedisProcess) -> None:
    client = connect_redis(small_redis.url)
    clock = Clock()
    gate = RedisMemoryGate(client, marks=MemoryMarks(0.85, 0.75), check_every=60.0, clock=clock)
    try:
        assert await gate.allows()
        _fill(small_redis, 14)
        gate.published(fields_bytes=6 << 20, entries=1000)  # more than the headroom
        assert not await gate.allows(), "re-read before the interval: the batch could overflow"
    finally:
        await client.aclose()


async def test_an_oom_reply_pauses_until_a_reading_says_otherwise(
    small_redis: RedisProcess,
) -> None:
    client = connect_redis(small_redis.url)
    clock = Clock()
    gate = RedisMemoryGate(client, check_every=1.0, clock=clock)
    try:
        assert await gate.allows()
        gate.refused()
        assert gate.paused
        assert await gate.allows(), "the next reading (not the interval) decides"
    finally:
        await client.aclose()


async def test_a_hint_claims_at_once_only_while_the_last_reading_stands(
    small_redis: RedisProcess,
) -> None:
    """``open_now``: what a notification may go by without reading Redis (it cannot wait)."""
    client = connect_redis(small_redis.url)
    clock = Clock()
    gate = RedisMemoryGate(client, marks=MemoryMarks(0.85, 0.75), check_every=1.0, clock=clock)
    try:
        assert not gate.open_now(), "never read: the loop reads first"
        assert await gate.allows()
        assert gate.open_now()
        clock.now += 1.0
        assert not gate.open_now(), "a reading is due"
        assert await gate.allows()
        gate.refused()
        assert not gate.open_now(), "Redis said OOM"
        unlimited = RedisMemoryGate(client, marks=MemoryMarks(0))
        assert unlimited.open_now(), "no high mark: nothing to read"
    finally:
        await client.aclose()


async def test_a_worker_sets_up_its_group_on_a_full_redis(small_redis: RedisProcess) -> None:
    client: RedisClient = connect_redis(small_redis.url)
    try:
        assert await ensure_group(client, "workflow.tasks.q.0", "workers")
        _fill(small_redis, 2)
        small_redis.cli("CONFIG", "SET", "maxmemory", "2mb")  # now below what is used: full
        with pytest.raises(ResponseError, match="maxmemory"):
            await client.set("probe", "x")
        assert not await ensure_group(client, "workflow.tasks.q.0", "workers"), "exists: fine"
        with pytest.raises(ResponseError, match="maxmemory"):
            await ensure_group(client, "workflow.tasks.q.1", "workers")  # cannot be created
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("policy", "says"),
    [("allkeys-lru", "stream entries (tasks lost)"), ("volatile-ttl", "lease and done keys")],
)
async def test_an_evicting_policy_is_an_error_in_the_log(
    redis_process: RedisProcess, policy: str, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = connect_redis(redis_process.url)
    try:
        assert await check_eviction_policy(client) == "noeviction"
        assert not caplog.records
        redis_process.cli("CONFIG", "SET", "maxmemory-policy", policy)
        assert await check_eviction_policy(client) == policy
        (record,) = caplog.records
        assert record.levelname == "ERROR"
        assert says in record.getMessage()
        assert "noeviction" in record.getMessage()
    finally:
        await client.aclose()
