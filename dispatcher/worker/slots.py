"""The bounded pool of handler slots shared by every stream a worker reads.

A stream loop asks how many slots are free and reads at most that many
entries, so a busy shard cannot hoard the pool and starve the others; each
entry then takes one slot until its handler is done. (A loop that reads
without blocking takes the slots first and gives back what it did not fill,
so its whole batch starts as one piece.) ``take`` grabs what is
free now without waiting, so a read batch starts as one piece when it can;
``acquire`` waits for one slot (first come, first served). A caller never
waits while holding slots it has not put to work: that could deadlock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

__all__ = ["SlotPool"]


class SlotPool:
    """``size`` slots; ``free`` is a hint for how much to read, ``take``/``acquire`` the bound."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.size - self._held

    @property
    def held(self) -> int:
        return self._held

    def take(self, count: int) -> int:
        """Take up to ``count`` free slots now; none while others wait. Return how many."""
        if any(not w.done() for w in self._waiters):
            return 0
        taken = max(min(count, self.free), 0)
        self._held += taken
        return taken

    async def acquire(self) -> None:
        """Wait for one slot."""
        if self.take(1):
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as we were cancelled: pass it on
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            raise

    async def acquire_unless(self, stopping: asyncio.Event) -> bool:
        """Wait for one slot: True once it is ours, False if ``stopping`` is set first."""
        acquiring = asyncio.ensure_future(self.acquire())
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({acquiring, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not acquiring.done():
                acquiring.cancel()
                await asyncio.gather(acquiring, return_exceptions=True)
        if acquiring.cancelled() or acquiring.exception() is not None:
            return False
        if stopping.is_set():
            self.release()
            return False
        return True

    def release(self, count: int = 1) -> None:
        """Hand each of ``count`` slots to the first waiter, or free it."""
        if not self._waiters and count > 0:
            self._held -= count
            self._freed.set()
            return
        for _ in range(count):
            self._release_one()

    def _release_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._held -= 1
        self._freed.set()

    async def wait_free(self, *, within: float) -> int:
        """Wait (up to ``within`` seconds) until a slot is free; return the free count (maybe 0)."""
        if self.free <= 0:
            self._freed.clear()
            # asyncio.timeout, not wait_for: no extra task, so a release wakes the caller
            # one loop turn sooner (this is on every read of a busy worker).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self._freed.wait()
        return max(self.free, 0)
