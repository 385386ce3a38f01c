"""Whether this operator replica leads: what its loops wait on before each pass.

``dispatcher.controller.lease_election`` drives it through a Lease (``gain``/``lose``);
without leader election it is ``Leadership.always()``. Pure asyncio state, no I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["Leadership", "NotLeading"]

T = TypeVar("T")


class NotLeading(Exception):
    """This replica does not hold the Lease (any more): the pass did not run, or was stopped."""


class Leadership:
    """Whether this replica leads; what the operator's loops wait on.

    ``term`` counts the times leadership was gained: a loop that sees it change knows
    another replica may have written in between.
    """

    def __init__(self, *, leading: bool = False) -> None:
        self._leading = asyncio.Event()
        self._lost = asyncio.Event()
        self.term = 0
        if leading:
            self.gain()

    @classmethod
    def always(cls) -> Leadership:
        """No election (one replica): always leading."""
        return cls(leading=True)

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def gain(self) -> None:
        if not self.leading:
            self.term += 1
            self._lost = asyncio.Event()
            self._leading.set()

    def lose(self) -> None:
        if self.leading:
            self._leading.clear()
            self._lost.set()

    async def wait(self) -> None:
        await self._leading.wait()

    async def run(self, work: Awaitable[T]) -> T:
        """``work`` while leading; cancelled, raising ``NotLeading``, when leadership goes."""
        if not self.leading:
            if asyncio.iscoroutine(work):
                work.close()
            raise NotLeading
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise NotLeading
        return task.result()
