"""The shard count shared through Redis (``composer:stream_shards``).

The enqueuer (or the operator) publishes how many shards each queue has;
workers read it so they read exactly the streams that are written.
"""

from __future__ import annotations

import logging

from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import DEFAULT_SHARDS, SHARDS_KEY

__all__ = ["InvalidShardCount", "parse_shard_count", "publish_shard_count", "read_shard_count"]

log = logging.getLogger(__name__)


class InvalidShardCount(ValueError):
    """The shard key holds something that is not an integer >= 1."""


def parse_shard_count(raw: str | bytes | int, *, source: str = SHARDS_KEY) -> int:
    """Parse a shard count; raise ``InvalidShardCount`` with the source named."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidShardCount(f"{source} must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise InvalidShardCount(f"{source} must be an integer >= 1, got {value}")
    return value


async def publish_shard_count(client: RedisClient, shards: int) -> None:
    """Write the shard count (validated) to ``composer:stream_shards``."""
    parse_shard_count(shards, source="shard count")
    await client.set(SHARDS_KEY, str(shards))


async def read_shard_count(client: RedisClient, *, fallback: int | None = None) -> int:
    """The published shard count; ``fallback`` (STREAM_SHARDS) or the default if unset.

    A key that is set but invalid is an error, not a silent fallback: reading
    the wrong number of shards would strand messages.
    """
    raw = await client.get(SHARDS_KEY)
    if raw is None:
        shards = fallback if fallback is not None else DEFAULT_SHARDS
        log.warning(
            "%s is not set yet; using %d shards (STREAM_SHARDS or the default)",
            SHARDS_KEY,
            shards,
        )
        return shards
    return parse_shard_count(raw)
