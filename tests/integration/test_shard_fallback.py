"""``composer:stream_shards`` lost (Redis restarted without its data): every process says alike
which count it uses and why."""

from __future__ import annotations

import logging

import pytest

from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import SHARDS_KEY
from dispatcher.stream.shard_count import LiveShardCount, read_shard_count


async def test_the_enqueuer_and_the_worker_word_the_fallback_alike(
    redis_standalone: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    await redis_standalone.set(SHARDS_KEY, "8")
    enqueuer = LiveShardCount(redis_standalone, fallback=4, refresh_every=0)
    assert await enqueuer.current() == 8
    await redis_standalone.delete(SHARDS_KEY)
    caplog.set_level(logging.DEBUG, logger="dispatcher.stream.shard_count")
    caplog.clear()

    assert await enqueuer.current() == 4  # routes by STREAM_SHARDS (4 here)
    # The worker's watch keeps reading the shards it reads: its count in force is 8.
    assert await read_shard_count(redis_standalone, fallback=8, fallback_in_force=True) == 8

    assert [r.getMessage() for r in caplog.records] == [
        f"{SHARDS_KEY} is not set; using 4 shards (STREAM_SHARDS, 4 by default)",
        f"{SHARDS_KEY} is not set; using 8 shards (the count in force, kept)",
    ]


async def test_a_loop_says_an_unset_count_as_a_warning_on_its_first_read_only(
    redis_standalone: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Each reader decides (no process-wide memory): a second worker in the same process
    still warns on its own first read."""
    await redis_standalone.delete(SHARDS_KEY)
    caplog.set_level(logging.DEBUG, logger="dispatcher.stream.shard_count")
    for warn in (True, False, True):
        assert await read_shard_count(redis_standalone, fallback=2, warn=warn) == 2
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG, logging.WARNING]
