"""Natural batching: requests made while a write is in flight go out together next.

``Coalescer`` wraps a function that writes many items in one round trip.
Callers submit their items and await their results; requests made in the
same event-loop turn, or while the previous write is in flight, are joined
into the next write. Nothing waits on a timer, so a request is delayed by at
most one loop turn plus the round trip already in flight, and the round trips
per item fall as the load rises. A failed write fails every request in it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class _Request(Generic[T, R]):
    items: Sequence[T]
    future: asyncio.Future[list[R]]


class Coalescer(Generic[T, R]):
    """Joins concurrent ``submit`` calls into single calls of ``write``.

    ``write(items)`` must return one result per item, in order.
    """

    def __init__(self, write: Callable[[list[T]], Awaitable[list[R]]], *, name: str) -> None:
        self._write = write
        self._name = name
        self._queue: list[_Request[T, R]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, items: Sequence[T]) -> list[R]:
        """Have ``items`` written with whatever else is waiting; their results, in order."""
        if not items:
            return []
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(items, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_all(), name=self._name)
        return await future

    async def aclose(self) -> None:
        """Stop writing; requests not written yet are cancelled."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        left, self._queue = self._queue, []  # a flusher cancelled before it started
        for request in left:
            request.future.cancel()

    async def _flush_all(self) -> None:
        group: list[_Request[T, R]] = []
        try:
            await asyncio.sleep(0)  # let requests made in this loop turn join
            while self._queue:
                group, self._queue = self._queue, []
                await self._flush(group)
        finally:
            self._flusher = None
            left, self._queue = [*group, *self._queue], []
            for request in left:
                request.future.cancel()  # a no-op for requests already answered

    async def _flush(self, group: list[_Request[T, R]]) -> None:
        try:
            results = await self._write([item for request in group for item in request.items])
        except Exception as exc:
            for request in group:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        start = 0
        for request in group:
            end = start + len(request.items)
            if not request.future.done():
                request.future.set_result(results[start:end])
            start = end
