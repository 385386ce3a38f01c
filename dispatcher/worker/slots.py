"""The bounded pool of handler slots shared by every stream a worker reads.

A stream loop asks how many slots are free and reads at most that many
entries, so a busy shard cannot hoard the pool and starve the others; each
entry then takes one slot for the length of its handler run.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["SlotPool"]


class SlotPool:
    """``size`` slots; ``free`` is a hint for how much to read, ``acquire`` is the bound."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._semaphore = asyncio.Semaphore(size)
        self._held = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.size - self._held

    @property
    def held(self) -> int:
        return self._held

    async def acquire(self) -> None:
        await self._semaphore.acquire()
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        self._semaphore.release()
        self._freed.set()

    async def wait_free(self, *, within: float) -> int:
        """Wait (up to ``within`` seconds) until a slot is free; return the free count (maybe 0)."""
        if self.free <= 0:
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), within)
        return max(self.free, 0)
