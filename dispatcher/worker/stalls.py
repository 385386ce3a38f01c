"""A thread that watches the event loop: a stall long enough to let leases lapse is logged.

Leases are renewed on the event loop (``leases.py``), and async handlers run
on it. An async handler that blocks the loop (``time.sleep``, a blocking
client, long CPU work) stops every renewal: past the lease TTL another worker
may run the same attempts beside it. The loop cannot report its own stall
while it lasts, so a thread of its own does: once the loop has not answered
for longer than ``threshold`` (a third of the lease TTL: the keeper renews a
lease about that old) it logs one WARNING naming the task holding the loop,
and one more when the loop runs again. Meanwhile it calls ``while_stalled``
every ``threshold`` (the worker renews its leases from here, ``side_renewal.py``,
so no other worker starts the attempts; the warning stays: the entries in
hand go stale and nothing else on the loop runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LoopWatch"]

log = logging.getLogger(__name__)


class LoopWatch:
    """Warns while the event loop it watches does not answer for more than ``threshold`` s."""

    def __init__(
        self, *, threshold: float, what: str, while_stalled: Callable[[], None] | None = None
    ) -> None:
        self._threshold = threshold
        self._while_stalled = while_stalled
        self._acted = 0.0  # when while_stalled last ran
        self._what = what  # what the stall puts at risk, for the warning
        self._beat = time.monotonic()
        self._stalled_since: float | None = None  # the last beat before a stall warned of
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Watch the running loop, until ``stop()``."""
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._tick(loop)
        self._thread = threading.Thread(
            target=self._watch, args=(loop,), name="event loop watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: note that it answers, and say so once after a stall."""
        now = time.monotonic()
        if (since := self._stalled_since) is not None:
            self._stalled_since = None
            log.warning("the event loop runs again after %.1fs blocked", now - since)
        self._beat = now
        if not self._stop.is_set():
            self._timer = loop.call_later(self._threshold / 4, self._tick, loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the thread: warn once per stall, while it lasts."""
        while not self._stop.wait(self._threshold / 4):
            beat = self._beat
            now = time.monotonic()
            silent = now - beat
            if silent > self._threshold and now - self._acted >= self._threshold:
                self._acted = now
                self._act()
            if silent <= self._threshold or self._stalled_since == beat:
                continue
            self._stalled_since = beat
            log.warning(
                "the event loop has been blocked for %.1fs (in task %s), more than a third of "
                "the lease TTL: %s; async handlers must not block the event loop (run "
                "blocking calls with asyncio.to_thread, or make the handler a plain function)",
                silent,
                _running_task(loop),
                self._what,
            )

    def _act(self) -> None:
        if self._while_stalled is None:
            return
        try:
            self._while_stalled()
        except Exception:  # the watch goes on whatever the action did
            log.exception("acting on a blocked event loop failed")


def _running_task(loop: asyncio.AbstractEventLoop) -> str:
    """The name of the task running on ``loop`` (read from another thread: a hint only)."""
    try:
        task = asyncio.current_task(loop)
    except RuntimeError:
        return "?"
    return task.get_name() if task is not None else "none"
