"""The two loops of one shard stream: read new entries, reclaim orphaned ones.

Each stream has its own XREADGROUP loop (one single-key command at a time:
Cluster-safe, and a quiet shard never delays a busy one) and its own
XAUTOCLAIM loop. Both hand each batch they read to the worker's ``submit``,
which waits for handler slots. The read loop first takes the free slots and
reads what is there without blocking, into those slots: under load a batch is
as large as the free slots and starts as one piece, instead of every loop
reading the same free count and then splitting its batch while waiting for
slots. When that read finds nothing, it gives the slots back and blocks for
new entries holding none (a slot held through a blocking read on a quiet
shard would starve the busy ones). Redis errors are logged and retried with
a capped backoff; a loop never dies of a transient failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.entries import Message
from dispatcher.stream.publisher import error_code
from dispatcher.worker.slots import SlotPool

__all__ = ["StreamReader", "Submit"]

log = logging.getLogger(__name__)

# submit(reader, batch, held): ``held`` slots are already taken for the batch's first entries.
Submit = Callable[["StreamReader", Sequence[Message], int], Awaitable[None]]

_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 5.0
_SLOT_POLL = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReader:
    """Reads one stream of one queue for a worker until ``stopping`` is set."""

    consumer: RedisStreamConsumer
    queue: str
    slots: SlotPool
    submit: Submit
    stopping: asyncio.Event
    reclaim_idle_ms: int
    on_redis_ok: Callable[[], None]
    # Ids of the entries in hand (read, slot taken, not yet settled): never started twice.
    in_hand: set[str] = field(default_factory=set)

    @property
    def stream(self) -> str:
        return self.consumer.stream

    def settled(self, entry_ids: Sequence[str]) -> None:
        """``entry_ids`` are done with here (their handlers returned): free their slots."""
        self.in_hand.difference_update(entry_ids)
        self.slots.release(len(entry_ids))

    async def read_loop(self) -> None:
        backoff = _BACKOFF_FIRST
        while not self.stopping.is_set():
            free = await self.slots.wait_free(within=_SLOT_POLL)
            if free == 0:
                continue
            try:
                batch, held = await self._read(free)
            except (RedisError, OSError) as exc:
                backoff = await self._recover(exc, backoff, "read")
                continue
            backoff = _BACKOFF_FIRST
            self.on_redis_ok()
            if batch:
                await self.submit(self, batch, held)

    async def _read(self, free: int) -> tuple[list[Message], int]:
        """New entries and how many slots are held for them (the first ``held``)."""
        held = self.slots.take(free)
        if held:
            batch: list[Message] = []
            try:
                batch = await self.consumer.read_new(held, block=False)
            finally:
                self.slots.release(held - len(batch))  # all of them if the read failed
            if batch:
                return batch, len(batch)
        return await self.consumer.read_new(free), 0

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
            self.on_redis_ok()
            if batch:
                log.info("reclaimed %d idle entries", len(batch), extra={"stream": self.stream})
                await self.submit(self, batch, 0)

    async def _recover(self, exc: BaseException, backoff: float, what: str) -> float:
        """Log, wait ``backoff`` (or until stopping), re-create a lost group; next backoff."""
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
