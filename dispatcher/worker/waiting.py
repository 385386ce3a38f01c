"""Entries waiting for their queue's limits: kept fresh, retried as capacity frees.

An entry whose claim found no slot or token (``limit_scripts.WAIT``) took
nothing: no lease, no run counted. It stays in its worker's hand, pending in
the consumer group: its idle time is reset every third of ``reclaim_idle``
(``XCLAIM ... JUSTID``, which leaves the delivery count alone), so no reclaim
loop takes it and it is never dead-lettered for waiting. One task per queue
retries the queue's waiting entries, oldest first and no more at once than
the worker has free handler slots, whenever a slot of the queue is freed here
and otherwise every ``poll`` seconds (a slot freed by another worker, a new
token). A retry is a new claim; what still finds no room waits again.

Once the worker stops, the waiting entries are left pending (they hold no
lease): another worker reclaims them after ``reclaim_idle``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.stream.entries import Message
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.slots import SlotPool

__all__ = ["Retry", "WaitingRoom"]

log = logging.getLogger(__name__)

# retry(reader, entries): claim and start them again; returns once each started or was decided.
Retry = Callable[[StreamReader, Sequence[Message]], Awaitable[None]]

POLL = 0.05


@dataclass(slots=True)
class _Parked:
    reader: StreamReader
    message: Message
    fresh_at: float  # event-loop time its idle time was last reset


class WaitingRoom:
    """The entries of one worker that wait for their queue's limits."""

    def __init__(self, *, slots: SlotPool, reclaim_idle: float, poll: float = POLL) -> None:
        self.retry: Retry | None = None  # set by the worker once its deliveries exist
        self._slots = slots
        self._fresh_period = reclaim_idle / 3
        self.poll = poll
        self._parked: dict[str, collections.deque[_Parked]] = {}
        self._woken: dict[str, asyncio.Event] = {}
        self._serving: dict[str, asyncio.Task[None]] = {}
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
        if queue not in self._serving:
            self._serving[queue] = asyncio.create_task(self._serve(queue), name=f"waiting {queue}")

    def wake(self, queue: str) -> None:
        """A slot of ``queue`` was freed here: retry its waiting entries now."""
        if (event := self._woken.get(queue)) is not None:
            event.set()

    async def aclose(self) -> None:
        tasks = list(self._serving.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, queue: str) -> None:
        try:
            await self._serve_until_empty(queue)
        finally:
            # In this task, not a done callback: a park() after the loop saw the queue
            # empty must find no task and start one.
            self._serving.pop(queue, None)

    async def _serve_until_empty(self, queue: str) -> None:
        parked = self._parked[queue]
        woken = self._woken.setdefault(queue, asyncio.Event())
        while parked:
            if parked[0].reader.stopping.is_set():
                parked.clear()  # left pending: another worker reclaims them
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await woken.wait()
            woken.clear()
            await self._keep_fresh(parked)
            room = min(self._slots.free, len(parked))
            if room > 0 and self.retry is not None:
                await self._retry([parked.popleft() for _ in range(room)])

    async def _retry(self, entries: list[_Parked]) -> None:
        assert self.retry is not None
        by_reader: dict[int, tuple[StreamReader, list[Message]]] = {}
        for entry in entries:
            by_reader.setdefault(id(entry.reader), (entry.reader, []))[1].append(entry.message)
            self._retrying[entry.reader.stream, entry.message.id] = entry.fresh_at
        for reader, messages in by_reader.values():
            try:
                await self.retry(reader, messages)
            except Exception as exc:  # never the waiting loop's end: others still wait
                log.error("cannot retry waiting entries: %s", exc, exc_info=exc)
        self._retrying.clear()

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
