"""Which shard streams of a queue exist, and which still need reading after a decrease.

Readers do not trust the shard count: after it drops, the removed shards keep
their entries (and pending entries) until workers have handled them, and a
writer that still had the old count may add one more. So the streams to read
are shards ``0..count-1`` plus every other existing shard stream of the queue
that is not empty yet. Finding them is a SCAN with ``TYPE stream``, which
redis-py runs on every master of a Redis Cluster; it walks the whole keyspace,
so callers run it every few tens of seconds, not per read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import TASK_STREAM_PREFIX, parse_task_stream, validate_queue
from dispatcher.stream.stats import StreamStats, stream_stats

__all__ = ["ShardState", "existing_shards", "queue_shards", "task_queues"]

_SCAN_COUNT = 1000


async def _scan(client: RedisClient, pattern: str) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    async for key in client.scan_iter(match=pattern, count=_SCAN_COUNT, _type="stream"):
        try:
            found.append(parse_task_stream(str(key)))
        except ValueError:  # not one of ours (a queue name with a dot cannot exist)
            continue
    return found


async def existing_shards(client: RedisClient, queue: str) -> set[int]:
    """Shard numbers of ``queue`` whose stream exists, on every master."""
    pattern = f"{TASK_STREAM_PREFIX}{validate_queue(queue)}.*"
    return {shard for q, shard in await _scan(client, pattern) if q == queue}


async def task_queues(client: RedisClient) -> list[str]:
    """Every queue that has at least one shard stream, sorted."""
    return sorted({q for q, _ in await _scan(client, f"{TASK_STREAM_PREFIX}*")})


@dataclass(frozen=True, slots=True)
class ShardState:
    """One shard stream of a queue, against the count in force."""

    shard: int
    stats: StreamStats
    in_count: bool  # below the count: written to and read

    @property
    def draining(self) -> bool:
        """Beyond the count and not empty yet: read until it is."""
        return not self.in_count and (self.stats.length > 0 or self.stats.pending > 0)


async def queue_shards(
    client: RedisClient, queue: str, *, shards: int, group: str, known: Iterable[int] = ()
) -> list[ShardState]:
    """Shards ``0..shards-1`` and every other existing (or ``known``) shard of ``queue``."""
    numbers = set(range(shards)) | set(known) | await existing_shards(client, queue)
    out = []
    for shard in sorted(numbers):
        stats = await stream_stats(client, f"{TASK_STREAM_PREFIX}{queue}.{shard}", group)
        out.append(ShardState(shard=shard, stats=stats, in_count=shard < shards))
    return out
