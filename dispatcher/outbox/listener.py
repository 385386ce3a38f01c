"""The LISTEN side of the enqueuer: a dedicated connection that turns NOTIFY into wake-ups.

LISTEN is session state, so it never runs on a pooled connection: this holds
its own autocommit connection, reconnects with backoff (1 s doubling to 30 s)
and rotates it periodically (so a silently half-dead TCP session cannot
linger). It listens on ``outbox_new``, or the ``channel`` it is given (the cancel
relay's ``outbox_cancel``). After every (re)connect it wakes the enqueuer once, to
catch rows committed while nobody was listening; with the poll fallback, a lost
notification can delay a dispatch but never lose it.

PostgreSQL has no permissions on channels: any role that can connect may
NOTIFY ``outbox_new`` with anything. So a notification is a hint, never data
(``NotificationHints``): the trigger sends the empty payload, which wakes a
claim, and the claim reads rows from the table under the enqueuer's own
privileges. Any other payload is counted and ignored, with one warning a
minute at most. A flood of hints costs at most one claim in flight at a time:
wake-ups collapse into one. Nothing a notification holds, and no failure of
the connection or of a callback, ends the listener: it reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.metrics import EnqueuerMetrics

__all__ = ["NOTIFY_CHANNEL", "Hinted", "Hints", "NotificationHints", "OutboxListener"]

NOTIFY_CHANNEL = "outbox_new"

log = logging.getLogger(__name__)

_CONNECT: dict[str, Any] = {
    "autocommit": True,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "connect_timeout": 10,
}
# At most one warning about ignored notifications per this many seconds.
_WARN_EVERY = 60.0


class Hinted(Protocol):
    """What a hint is for: ``BatchSlots`` (a batch at once, or the loop rung)."""

    def hinted(self) -> None: ...


class Hints(Protocol):
    """What the listener hands every notification's payload to."""

    def receive(self, payload: str) -> None: ...


class NotificationHints:
    """What a notification on the channel means: the empty payload is a hint for ``target``,
    the rest is ignored."""

    def __init__(
        self,
        *,
        target: Hinted,
        metrics: EnqueuerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._metrics = metrics
        self._clock = clock
        self._warned_at: float | None = None
        self.ignored = 0  # since the last warning

    def receive(self, payload: str) -> None:
        if not payload:
            self._target.hinted()
            return
        self.ignored += 1
        self._metrics.notifications_ignored.inc()
        now = self._clock()
        if self._warned_at is None or now - self._warned_at >= _WARN_EVERY:
            log.warning(
                "ignored %d notification(s) on %s with a payload (the trigger sends none: "
                "some other session sent them; rows are only ever read from the table)",
                self.ignored,
                NOTIFY_CHANNEL,
            )
            self._warned_at = now
            self.ignored = 0


class OutboxListener:
    def __init__(
        self,
        *,
        conninfo: str,
        hints: Hints,
        signals: LoopSignals,
        rotate_after: float = 600.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        channel: str = NOTIFY_CHANNEL,
        application_name: str = "outbox-dispatcher-listener",
    ) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._connect = _CONNECT | {"application_name": application_name}
        self._hints = hints
        self._signals = signals
        self._rotate_after = rotate_after
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self.connected = False
        self.connects = 0

    async def run(self) -> None:
        """Listen until cancelled; never ends on connection trouble or a bad notification."""
        backoff = self._initial_backoff
        while True:
            connects_before = self.connects
            try:
                await self._listen()
            except Exception as exc:
                if self.connects > connects_before:  # it was up: start the backoff over
                    backoff = self._initial_backoff
                _disconnected(exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            else:
                backoff = self._initial_backoff

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._connect)
        try:
            await conn.execute(f"LISTEN {self._channel}")
            self.connects += 1
            self._set_connected(True)  # rings: rows committed while nobody listened
            # One generator until the rotation: between notifications it only waits (ending
            # it after each would rebuild it before the loop runs the claim it woke).
            async for notice in conn.notifies(timeout=self._rotate_after):
                self._hints.receive(notice.payload)
                await asyncio.sleep(0)  # what it woke runs before this waits again
            log.debug("rotating the outbox listener connection")
        finally:
            self._set_connected(False)
            await conn.close()

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._signals.heard(connected=connected)


def _disconnected(exc: BaseException, backoff: float) -> None:
    expected = isinstance(exc, (psycopg.Error, OSError))
    log.warning(
        "outbox listener disconnected (%s); polling until it reconnects in %.0f s",
        _first_line(exc) if expected else f"{type(exc).__name__}: {_first_line(exc)}",
        backoff,
        exc_info=not expected,
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
