"""Everything the operator asks Redis, in as few round trips as possible.

``measure`` reads, in one pipelined round trip per dispatcher, the published
shard count, its owner marker (``dispatcher.controller.shard_owner``) and each shard
stream's length and pending count (delivered to the workers' group, not yet
acked) for every queue the operator cares about: the queues of the spec and those
still draining. The shard decision, the
autoscaler and the drain check all work from that one ``Measurement``.

One client is kept per dispatcher (``RedisPool``), replaced when its URL
changes. Errors are reported by host and port only: a URL may hold a password.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError, ResponseError

from dispatcher.redis_client import RedisClient, connect_redis, queue_get_raw
from dispatcher.stream.naming import SHARDS_KEY, SHARDS_OWNER_KEY, WORKER_GROUP, task_stream
from dispatcher.stream.shard_count import InvalidShardCount, parse_shard_count

__all__ = [
    "NOT_TEXT",
    "WORKER_GROUP",
    "Measurement",
    "RedisPool",
    "RedisProblem",
    "measure",
    "redis_message",
]

RedisProblem = (RedisError, OSError, InvalidShardCount)


@dataclass(frozen=True, slots=True)
class Measurement:
    """The published shard count, its owner marker as read, and per stream (length, pending)."""

    published: int | None
    streams: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    shards: int = 1  # how many shards of each queue were read
    owner: Any = None  # the raw value of SHARDS_OWNER_KEY (None: no marker)

    def queue(self, queue: str) -> tuple[int, int]:
        """Entries (not yet acked, since acked ones are deleted) and pending ones, summed."""
        rows = [self.streams.get(task_stream(queue, s), (0, 0)) for s in range(self.shards)]
        return sum(r[0] for r in rows), sum(r[1] for r in rows)


# What the owner marker reads as when it holds bytes that are not UTF-8 (a decoding client
# cannot return them): something that is not an owner record.
NOT_TEXT = b"\xff"


async def _pipelined(
    client: RedisClient, *, queues: list[str], shards: int
) -> tuple[int | None, Any, dict[str, tuple[int, int]]]:
    try:
        return await _pipelined_once(client, queues=queues, shards=shards, marker=True)
    except UnicodeDecodeError:  # the marker is not text (the count is read again: an error)
        published, _, found = await _pipelined_once(
            client, queues=queues, shards=shards, marker=False
        )
        return published, NOT_TEXT, found


async def _pipelined_once(
    client: RedisClient, *, queues: list[str], shards: int, marker: bool
) -> tuple[int | None, Any, dict[str, tuple[int, int]]]:
    streams = [task_stream(q, s) for q in queues for s in range(shards)]
    pipe: Any = client.pipeline(transaction=False)
    queue_get_raw(pipe, SHARDS_KEY)  # bytes: not UTF-8 is an invalid count, not a crash
    if marker:
        pipe.get(SHARDS_OWNER_KEY)
    else:
        pipe.ping()
    for stream in streams:
        pipe.xlen(stream)
        pipe.xpending(stream, WORKER_GROUP)
    replies = await pipe.execute(raise_on_error=False)
    raw, owner = replies[0], replies[1]
    for reply in (raw, owner):
        if isinstance(reply, Exception):
            raise reply
    found: dict[str, tuple[int, int]] = {}
    for i, stream in enumerate(streams):
        length, pending = replies[2 + 2 * i], replies[3 + 2 * i]
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, ResponseError):  # no such stream or group yet: nothing pending
            pending = {"pending": 0}
        elif isinstance(pending, Exception):
            raise pending
        found[stream] = (int(length), int(pending.get("pending") or 0))
    return (None if raw is None else parse_shard_count(raw)), owner, found


async def measure(client: RedisClient, *, queues: Iterable[str], shards: int) -> Measurement:
    """One round trip: the published count and ``shards`` streams of each queue.

    Should the published count be higher than ``shards`` (set by hand), a
    second round trip reads the streams up to it, so no entry goes unseen.
    """
    names = sorted(set(queues))
    published, owner, streams = await _pipelined(client, queues=names, shards=shards)
    if published is not None and published > shards:
        shards = published
        published, owner, streams = await _pipelined(client, queues=names, shards=shards)
    return Measurement(published=published, streams=streams, shards=shards, owner=owner)


@dataclass
class RedisPool:
    """One Redis client per dispatcher, replaced when its URL changes."""

    timeout: float
    _clients: dict[tuple[str, str], tuple[str, RedisClient]] = field(default_factory=dict)

    def client(self, key: tuple[str, str], *, url: str, cluster: bool) -> RedisClient:
        fingerprint = hashlib.sha256(f"{cluster}|{url}".encode()).hexdigest()
        held = self._clients.get(key)
        if held is not None and held[0] == fingerprint:
            return held[1]
        client = connect_redis(url, cluster=cluster, socket_timeout=self.timeout)
        self._clients[key] = (fingerprint, client)
        return client

    def held(self, key: tuple[str, str]) -> RedisClient | None:
        """The client of ``key``'s dispatcher, if it has one."""
        held = self._clients.get(key)
        return None if held is None else held[1]

    async def drop(self, key: tuple[str, str]) -> None:
        held = self._clients.pop(key, None)
        if held is not None:
            await held[1].aclose()

    async def close(self) -> None:
        for key in list(self._clients):
            await self.drop(key)


def redis_message(client: RedisClient, exc: BaseException) -> str:
    """One line naming the host (never the URL: it may carry a password)."""
    pool = getattr(client, "connection_pool", None)
    kwargs: Mapping[str, Any] = getattr(pool, "connection_kwargs", {})
    where = f" at {kwargs['host']}:{kwargs.get('port', 6379)}" if kwargs.get("host") else ""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot reach Redis{where}: {detail}"
