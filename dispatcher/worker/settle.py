"""Settling finished entries in groups: done marks first, then XACK + XDEL.

Entries that finish while a group is being written (or in the same turn of
the event loop) are written together in the next group (``coalesce.py``),
one XACK and one XDEL per stream for all of them. Nothing waits on a timer:
an ack is delayed by at most one loop turn plus the round trip in flight.

The order is the guarantee: an entry is never acked before its attempt's
done mark is written. On standalone Redis a group is one MULTI/EXEC (done
marks, then acks; a command refused while queueing aborts all of it). On
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
from dataclasses import dataclass

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dedup import AttemptGuard

__all__ = ["Settler"]

log = logging.getLogger(__name__)

# Seconds to wait before each retry of a group whose connection failed (~3 s in all).
RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)


@dataclass(frozen=True, slots=True)
class _Ack:
    consumer: RedisStreamConsumer
    entry_id: str
    done: str | None  # the dedup key whose done mark precedes the ack


class Settler:
    """Acks finished entries of all of a worker's streams, in groups."""

    def __init__(self, client: RedisClient, guard: AttemptGuard) -> None:
        self._client = client
        self._guard = guard
        self._cluster = isinstance(client, RedisCluster)
        self._groups = Coalescer(self._write, name="settle")

    async def settle(
        self, consumer: RedisStreamConsumer, entry_id: str, *, done: str | None = None
    ) -> None:
        """Write ``done``'s mark (if given), then ack and delete the entry; raise on failure."""
        await self._groups.submit([_Ack(consumer, entry_id, done)])

    async def aclose(self) -> None:
        await self._groups.aclose()

    async def _write(self, group: list[_Ack]) -> list[None]:
        for delay in RETRY_DELAYS:
            try:
                return await self._write_once(group)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("settling %d entries failed (%s); retrying", len(group), exc)
                await asyncio.sleep(delay)
        return await self._write_once(group)

    async def _write_once(self, group: list[_Ack]) -> list[None]:
        done = [ack.done for ack in group if ack.done is not None]
        if self._cluster and done:
            await self._guard.mark_done_many(done)
            done = []
        pipe = self._client.pipeline(transaction=not self._cluster)
        self._guard.add_done_marks(pipe, done)
        for consumer, ids in _by_stream(group):
            consumer.add_ack(pipe, ids)
        await pipe.execute()
        return [None] * len(group)


def _by_stream(group: list[_Ack]) -> list[tuple[RedisStreamConsumer, list[str]]]:
    streams: dict[str, tuple[RedisStreamConsumer, list[str]]] = {}
    for ack in group:
        streams.setdefault(ack.consumer.stream, (ack.consumer, []))[1].append(ack.entry_id)
    return list(streams.values())
