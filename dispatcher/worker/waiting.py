"""Entries waiting for their queue's limits: kept fresh, retried as capacity frees.

An entry whose claim found no slot or token (``limit_scripts.WAIT``) took
nothing: no lease, no run counted. It stays in its worker's hand, pending in
the consumer group: its idle time is reset every third of ``reclaim_idle``
(``XCLAIM ... JUSTID``, which leaves the delivery count alone), so no reclaim
loop takes it and it is never dead-lettered for waiting. ``released`` hands
a queue's waiting entries back to the worker's loop for that queue, oldest
first and no more at once than the worker has free handler slots, whenever a
slot of the queue is freed here and otherwise every ``poll`` seconds (a slot
freed by another worker, a new token). Their retry is a new claim; what
still finds no room waits again.

Once the worker stops, the waiting entries are left pending (they hold no
lease): another worker reclaims them after ``reclaim_idle``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.stream.entries import Message
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.slots import SlotPool

__all__ = ["WaitingRoom"]

log = logging.getLogger(__name__)

# Seconds between two looks at a queue's waiting entries when no slot is freed here
# (a slot freed by another worker, a new token).
POLL = 0.05


@dataclass(slots=True)
class _Parked:
    reader: StreamReader
    message: Message
    fresh_at: float  # event-loop time its idle time was last reset


class WaitingRoom:
    """The entries of one worker that wait for their queue's limits."""

    def __init__(self, *, slots: SlotPool, reclaim_idle: float, poll: float = POLL) -> None:
        self._slots = slots
        self._fresh_period = reclaim_idle / 3
        self.poll = poll
        self._parked: dict[str, collections.deque[_Parked]] = {}
        self._woken: dict[str, asyncio.Event] = {}  # a slot of the queue was freed here
        self._arrived: dict[str, asyncio.Event] = {}  # entries of the queue were parked
        # (stream, entry id) -> fresh_at of the entries being retried: one that waits
        # again keeps it (its idle time was not reset by the retry).
        self._retrying: dict[tuple[str, str], float] = {}

    def count(self, queue: str) -> int:
        parked = self._parked.get(queue)
        return len(parked) if parked else 0

    def park(self, reader: StreamReader, messages: Sequence[Message]) -> None:
        """Keep ``messages`` (still in ``reader``'s hand) until their queue has room."""
        now = asyncio.get_running_loop().time()
        queue, retrying = reader.queue, self._retrying
        self._parked.setdefault(queue, collections.deque()).extend(
            _Parked(reader, message, retrying.pop((reader.stream, message.id), now))
            for message in messages
        )
        self._arrived.setdefault(queue, asyncio.Event()).set()

    def wake(self, queue: str) -> None:
        """A slot of ``queue`` was freed here: retry its waiting entries now."""
        if (event := self._woken.get(queue)) is not None:
            event.set()

    async def released(
        self, queue: str, *, stopping: asyncio.Event
    ) -> AsyncIterator[tuple[StreamReader, list[Message]]]:
        """The waiting entries of ``queue`` as there is room to retry them, by reader.

        Each is to be claimed and started again before the next is asked for. Ends once
        ``stopping`` is set; the entries still waiting are then left pending (another
        worker reclaims them).
        """
        parked = self._parked.setdefault(queue, collections.deque())
        arrived = self._arrived.setdefault(queue, asyncio.Event())
        woken: asyncio.Event | None = None
        while not stopping.is_set():
            if not parked:
                arrived.clear()
                await _either(arrived, stopping)
                continue
            if woken is None:  # a wake before the first entry waited is no news to them
                woken = self._woken.setdefault(queue, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await woken.wait()
            woken.clear()
            await self._keep_fresh(parked)
            room = min(self._slots.free, len(parked))
            if room > 0:
                for reader, messages in self._retried([parked.popleft() for _ in range(room)]):
                    yield reader, messages
                self._retrying.clear()
        parked.clear()

    def _retried(self, entries: list[_Parked]) -> list[tuple[StreamReader, list[Message]]]:
        """``entries`` by reader; each keeps its freshness should it wait again."""
        by_reader: dict[int, tuple[StreamReader, list[Message]]] = {}
        for entry in entries:
            by_reader.setdefault(id(entry.reader), (entry.reader, []))[1].append(entry.message)
            self._retrying[entry.reader.stream, entry.message.id] = entry.fresh_at
        return list(by_reader.values())

    async def _keep_fresh(self, parked: collections.deque[_Parked]) -> None:
        now = asyncio.get_running_loop().time()
        due: dict[int, tuple[StreamReader, list[_Parked]]] = {}
        for entry in parked:
            if now - entry.fresh_at >= self._fresh_period:
                due.setdefault(id(entry.reader), (entry.reader, []))[1].append(entry)
        for reader, found in due.values():
            try:
                await reader.consumer.keep_fresh([entry.message.id for entry in found])
            except (RedisError, OSError) as exc:
                log.warning(
                    "cannot keep waiting entries fresh: %s", exc, extra={"stream": reader.stream}
                )
                continue
            for entry in found:
                entry.fresh_at = now


async def _either(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
