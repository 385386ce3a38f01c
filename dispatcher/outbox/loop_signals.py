"""What the enqueuer's parts tell its scheduling loop, and read of it.

The enqueuer makes one ``LoopSignals`` first and hands it to each part it builds (the listener,
the batch slots, the suspect probes, maintenance): a part rings it to ask for a claim, and the
loop waits on it; any number of rings before the loop wakes collapse into one wake-up. The
listener says whether its LISTEN connection is up (``listening``); ``request_stop`` says the
enqueuer is stopping. Nothing here calls back into the loop: the parts write, the loop reads.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["LoopSignals"]


class LoopSignals:
    """A wake-up for the loop, whether notifications can be heard, whether it is stopping."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()
        self.listening = False  # the LISTEN connection is up (its listener says so)
        self.stopping = False

    def ring(self) -> None:
        """Ask the loop to claim now; any number of rings collapse into one wake-up."""
        self._rung.set()

    def ring_in(self, delay: float) -> None:
        """Ring after ``delay`` seconds (at once if it is not positive)."""
        if delay <= 0:
            self._rung.set()
        else:
            asyncio.get_running_loop().call_later(delay, self._rung.set)

    def heard(self, *, connected: bool) -> None:
        """The listener's connection came up or went down: the loop looks again either way
        (up: rows committed while nobody listened; down: nobody hears NOTIFY now)."""
        self.listening = connected
        self._rung.set()

    def request_stop(self) -> None:
        self.stopping = True
        self._rung.set()

    def can_listen(self) -> bool:
        """Commits are heard: the listener is up and the enqueuer not stopping (an idle
        enqueuer may then hold the idle flag, so that inserts NOTIFY)."""
        return self.listening and not self.stopping

    async def wait(self, within: float) -> None:
        """Until a ring, or ``within`` seconds. A timeout scope, not wait_for: no task of its
        own, so a notification reaches the claim a few turns of the loop sooner."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._rung.wait()
        self._rung.clear()
