"""The tasks a worker owns and waits for on shutdown, and when Redis last answered it.

A worker runs two kinds of task: its loops (read and reclaim per stream, the shard
watch, the stats, the cancel watch, the waiting room per queue), which must never end
before the worker stops, and the tasks that settle its read batches. Each kind is a task
set (``LoopSet``, ``HandlingSet``) built once by the worker and handed to the part that
starts such tasks (``streams.py`` its loops, ``delivery.py`` its batches), so no part
calls back into the worker to start one. ``RedisContact`` is handed the same way to
every loop that talks to Redis: each answer it gets is recorded there, and the worker's
probes read it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from dispatcher.outage import Outage

__all__ = ["HandlingSet", "LoopSet", "RedisContact"]

log = logging.getLogger(__name__)


class _Tasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` as a task of this set."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[None]]:
        return iter(set(self._tasks))

    def _ended(self, task: asyncio.Task[None]) -> None:
        raise NotImplementedError


class LoopSet(_Tasks):
    """The worker's loops: one that ended stays in the set, so ``any_done`` says one died."""

    def any_done(self) -> bool:
        return any(t.done() for t in self._tasks)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("worker loop %s crashed: %s", task.get_name(), exc, exc_info=exc)


class HandlingSet(_Tasks):
    """The tasks settling read batches: one leaves the set when it ends."""

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("unexpected error settling entries: %s", exc, exc_info=exc)


class RedisContact:
    """When Redis last answered one of the worker's loops (its probes' clock), and its outage
    as the worker logs it (one warning when it starts, whichever loop sees it first)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last_ok = clock()
        self.outage = Outage("Redis")

    def ok(self) -> None:
        """Redis answered: ends the outage, if one was reported."""
        self.last_ok = self._clock()
        self.outage.ok()

    def silent_for(self) -> float:
        return self._clock() - self.last_ok
