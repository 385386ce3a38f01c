"""The two loops of one shard stream: read new entries, reclaim orphaned ones.

Each stream has its own XREADGROUP loop (one single-key command at a time: Cluster-safe,
and a quiet shard never delays a busy one) and its own XAUTOCLAIM loop. Both hand each
batch they read to the worker's deliveries (``delivery.py``: ``take``), which return
once every entry of the batch was started or decided, so a loop never reads far ahead of
its handlers. Handler slots bound the handlers running, not the entries read, and a read
holds none (a slot held through a blocking read on a quiet shard would starve the busy
ones): the read loop waits until a slot is free and reads as many entries as slots are
free or, while the handlers of its stream all finish in their first step (they hold a
slot for no time at all), up to ``READ_AHEAD`` entries, so a batch of quick handlers
costs the same round trips as one entry. Redis errors are logged and retried with a
capped backoff; a loop never dies of a transient failure. Redis being unreachable is
reported to ``dispatcher.outage`` (one warning per outage for the process, not one per
shard per retry), each answer to the worker's ``RedisContact``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from redis.exceptions import RedisError

from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.entries import Message
from dispatcher.stream.publisher import error_code
from dispatcher.worker.slots import SlotPool
from dispatcher.worker.task_set import RedisContact

__all__ = ["BatchSink", "ReadLimits", "StreamReader"]

log = logging.getLogger(__name__)

# Entries one read takes while the stream's handlers finish in their first step, so the
# round trips and the Python of a batch (read, claim, settle) stop mattering per entry.
# On the no-op worker benchmark 300 against 100 settled ~25 % more messages per second at
# ~17 % less worker CPU each; 1000 gained no more (2026-12-03; benchmarks/NOTES.md,
# "Figures the code's comments quote"). The claim of a batch is one script: with 4 busy
# shards joined, ~1,200 keys.
READ_AHEAD = 300

_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 5.0
_SLOT_POLL = 0.2


class BatchSink(Protocol):
    """Where a reader hands what it read: the worker's ``delivery.Deliveries``."""

    async def take(self, reader: StreamReader, batch: Sequence[Message]) -> None:
        """Return once each entry of ``batch`` was started or decided."""
        ...


class ReadLimits(Protocol):
    """What a reader asks of its worker's queue limits (``limits.LimitGate``)."""

    async def room(self, queue: str, want: int) -> int:
        """How many of ``want`` entries a read of ``queue`` may take now."""
        ...

    def settled(self, stream: str, entry_ids: Sequence[str]) -> None:
        """``entry_ids`` of ``stream`` are done with: free the slots they hold."""
        ...


@dataclass(slots=True, kw_only=True)
class StreamReader:
    """Reads one stream of one queue for a worker until ``stopping`` is set."""

    consumer: RedisStreamConsumer
    queue: str
    slots: SlotPool
    deliveries: BatchSink
    stopping: asyncio.Event
    reclaim_idle_ms: int
    contact: RedisContact
    # Ids of the entries in hand (read, not yet done with): never started twice.
    in_hand: set[str] = field(default_factory=set)
    # The handlers of the last batch all finished in their first step: read ahead.
    inline: bool = False
    # The queue limits of the worker: frees slots, bounds reads while entries wait.
    limits: ReadLimits | None = None

    @property
    def stream(self) -> str:
        return self.consumer.stream

    def settled(self, entry_ids: Sequence[str]) -> None:
        """``entry_ids`` are done with here (their handlers returned, or they were decided)."""
        self.in_hand.difference_update(entry_ids)
        if self.limits is not None:
            self.limits.settled(self.stream, entry_ids)

    async def read_loop(self) -> None:
        backoff = _BACKOFF_FIRST
        while not self.stopping.is_set():
            free = await self.slots.wait_free(within=_SLOT_POLL)
            if free == 0:
                continue
            want = max(free, READ_AHEAD) if self.inline else free
            if self.limits is not None and not (want := await self.limits.room(self.queue, want)):
                continue
            try:
                batch = await self.consumer.read_new(want)
            except (RedisError, OSError) as exc:
                backoff = await self._recover(exc, backoff, "read")
                continue
            backoff = _BACKOFF_FIRST
            self.contact.ok()
            if batch:
                await self.deliveries.take(self, batch)

    async def reclaim_loop(self) -> None:
        backoff = _BACKOFF_FIRST
        interval = self.reclaim_idle_ms / 2000
        while not await self._stopped_within(interval):
            try:
                batch = await self.consumer.reclaim_orphaned(self.reclaim_idle_ms)
            except (RedisError, OSError) as exc:
                backoff = await self._recover(exc, backoff, "reclaim")
                continue
            backoff = _BACKOFF_FIRST
            self.contact.ok()
            if batch:
                log.info("reclaimed %d idle entries", len(batch), extra={"stream": self.stream})
                await self.deliveries.take(self, batch)

    async def _recover(self, exc: BaseException, backoff: float, what: str) -> float:
        """Log, wait ``backoff`` (or until stopping), re-create a lost group; next backoff."""
        if not self.contact.outage.failed(exc, what=what):
            log.warning("%s failed: %s; retrying", what, exc, extra={"stream": self.stream})
        await self._stopped_within(backoff)
        if error_code(exc) == "NOGROUP":
            with contextlib.suppress(RedisError, OSError):
                await self.consumer.setup()
        return min(backoff * 2, _BACKOFF_MAX)

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()
