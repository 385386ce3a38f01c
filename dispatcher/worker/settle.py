"""Settling finished entries in groups: done marks first, then XACK + XDEL.

Entries that finish while a group is being written (or in the same turn of
the event loop) are written together in the next group (``coalesce.py``),
one XACK and one XDEL per stream for all of them. Nothing waits on a timer:
an ack is delayed by at most one loop turn plus the round trip in flight.

The order is the guarantee: an entry is never acked before its attempt's
done mark is written. On standalone Redis a group is one script call
(``_SETTLE``: done marks, then acks; a done mark that fails, say on OOM,
ends the script before any ack, and an ack that fails does not stop the
others, as in MULTI/EXEC: the first error is raised once all ran). On
Redis Cluster the done keys and the streams live in different slots, so the
done marks go first as one pipeline and the acks follow only once it
succeeded. Every command here may be repeated safely (SET of the done mark,
XACK, XDEL), so a group whose connection dropped is retried with a short
backoff before it fails: a handler that succeeded should not run again just
because Redis blinked. A group that still fails fails every waiter; its
entries that were not acked stay pending and are reclaimed later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dedup import AttemptGuard, attempt_key

__all__ = ["Settler"]

log = logging.getLogger(__name__)

# KEYS: the attempt keys to mark done, then the streams; ARGV: done TTL ms, number of done
# keys, then per stream its group, its id count and the ids.
_SETTLE = """
local done = tonumber(ARGV[2])
for i = 1, done do
  redis.call('set', KEYS[i], 'done', 'PX', ARGV[1])
end
local first_error = nil
local function run(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err and not first_error then
    first_error = reply.err
  end
end
local at = 3
for s = done + 1, #KEYS do
  local group, count = ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  local last = at + count - 1
  while at <= last do
    local upto = math.min(at + 999, last)  -- unpack() has a stack limit
    run('xack', KEYS[s], group, unpack(ARGV, at, upto))
    run('xdel', KEYS[s], unpack(ARGV, at, upto))
    at = upto + 1
  end
end
if first_error then
  return redis.error_reply(first_error)
end
return 0
"""

# Seconds to wait before each retry of a group whose connection failed (~3 s in all).
RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)


@dataclass(frozen=True, slots=True)
class _Acks:
    """Entries of one stream to ack; ``done``: dedup keys whose marks precede the acks."""

    consumer: RedisStreamConsumer
    entry_ids: Sequence[str]
    done: Sequence[str]


class Settler:
    """Acks finished entries of all of a worker's streams, in groups."""

    def __init__(self, client: RedisClient, guard: AttemptGuard) -> None:
        self._client = client
        self._guard = guard
        self._cluster = isinstance(client, RedisCluster)
        self._groups = Coalescer(self._write, name="settle")
        self._settle = client.register_script(_SETTLE)

    async def settle(
        self, consumer: RedisStreamConsumer, entry_id: str, *, done: str | None = None
    ) -> None:
        """Write ``done``'s mark (if given), then ack and delete the entry; raise on failure."""
        await self.settle_many(consumer, [entry_id], done=[done] if done is not None else [])

    async def settle_many(
        self, consumer: RedisStreamConsumer, entry_ids: Sequence[str], *, done: Sequence[str]
    ) -> None:
        """Write the done marks of ``done``, then ack and delete ``entry_ids``; raise on failure."""
        await self._groups.submit([_Acks(consumer, entry_ids, done)])

    async def aclose(self) -> None:
        await self._groups.aclose()

    async def _write(self, group: list[_Acks]) -> list[None]:
        for delay in RETRY_DELAYS:
            try:
                return await self._write_once(group)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("settling %d entries failed (%s); retrying", _size(group), exc)
                await asyncio.sleep(delay)
        return await self._write_once(group)

    async def _write_once(self, group: list[_Acks]) -> list[None]:
        done = [key for acks in group for key in acks.done]
        streams = _by_stream(group)
        if self._cluster:
            await self._guard.mark_done_many(done)
            pipe = self._client.pipeline(transaction=False)
            for consumer, ids in streams:
                consumer.add_ack(pipe, ids)
            await pipe.execute()
        else:
            # As bytes: redis-py packs bytes at half the cost of str, on the hot path.
            keys = [attempt_key(k).encode() for k in done]
            keys += [consumer.stream.encode() for consumer, _ in streams]
            args: list[bytes | str | int] = [self._guard.done_ttl_ms, len(done)]
            for consumer, ids in streams:
                args += [consumer.group, len(ids), *(i.encode() for i in ids)]
            await self._settle(keys=keys, args=args)
        return [None] * len(group)


def _by_stream(group: list[_Acks]) -> list[tuple[RedisStreamConsumer, list[str]]]:
    streams: dict[str, tuple[RedisStreamConsumer, list[str]]] = {}
    for acks in group:
        streams.setdefault(acks.consumer.stream, (acks.consumer, []))[1].extend(acks.entry_ids)
    return list(streams.values())


def _size(group: list[_Acks]) -> int:
    return sum(len(acks.entry_ids) for acks in group)
