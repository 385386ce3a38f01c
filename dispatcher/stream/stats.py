"""Per-stream numbers for one consumer group: length, pending, consumers, lag.

Shared by the worker's backlog gauges and ``dispatcher status``. Two
single-key commands per stream (XLEN, XINFO GROUPS), so it works the same on
Redis Cluster. A stream or group that does not exist yet reads as zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from dispatcher.redis_client import RedisClient

__all__ = ["StreamStats", "stream_stats", "streams_stats"]


@dataclass(frozen=True, slots=True)
class StreamStats:
    """One stream as one group sees it.

    ``length`` is XLEN: entries not yet acked, since acked entries are deleted
    (XACK+XDEL), it is the backlog plus what is in flight. ``lag`` is Redis'
    own count of never-delivered entries, None when Redis cannot tell (before
    7.0, or after deletions inside the unread range).
    """

    stream: str
    group: str
    length: int
    pending: int = 0
    consumers: int = 0
    lag: int | None = None
    group_exists: bool = False


async def stream_stats(client: RedisClient, stream: str, group: str) -> StreamStats:
    """Read the stats of ``stream`` for ``group``."""
    length = int(await client.xlen(stream))
    if length == 0 and not await client.exists(stream):
        return StreamStats(stream=stream, group=group, length=0)
    try:
        groups: list[dict[str, Any]] = await client.xinfo_groups(stream)
    except ResponseError:  # the key vanished between the two calls
        return StreamStats(stream=stream, group=group, length=length)
    info = next((g for g in groups if g.get("name") == group), None)
    if info is None:
        return StreamStats(stream=stream, group=group, length=length)
    lag = info.get("lag")
    return StreamStats(
        stream=stream,
        group=group,
        length=length,
        pending=int(info.get("pending") or 0),
        consumers=int(info.get("consumers") or 0),
        lag=None if lag is None else int(lag),
        group_exists=True,
    )


async def streams_stats(
    client: RedisClient, streams: Iterable[str], group: str
) -> list[StreamStats]:
    """``stream_stats`` of each stream, in order."""
    return [await stream_stats(client, stream, group) for stream in streams]
