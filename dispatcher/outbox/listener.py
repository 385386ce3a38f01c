"""The LISTEN side of the enqueuer: a dedicated connection that hands on each NOTIFY.

LISTEN is session state, so it never runs on a pooled connection: this holds
its own autocommit connection, reconnects with backoff (1 s doubling to 30 s)
and rotates it periodically (so a silently half-dead TCP session cannot
linger). After every (re)connect it wakes the enqueuer once, to catch rows
committed while nobody was listening; with the poll fallback, a lost
notification can delay a dispatch but never lose it.

Notifications are handed on as they were read: every payload of one read goes
to ``notified`` (by default each is a wake-up), then ``after_read`` is awaited
in this task before the next read. The idle path publishes there, so a
notification's row goes out without a turn of the event loop in between, and
notifications that arrive meanwhile wait in the socket and are read, and
published, together. ``quiesce`` waits for a read being handled, so a shutdown
lets its publish finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import psycopg

__all__ = ["NOTIFY_CHANNEL", "OutboxListener"]

NOTIFY_CHANNEL = "outbox_new"

log = logging.getLogger(__name__)


class OutboxListener:
    def __init__(
        self,
        *,
        conninfo: str,
        wake: Callable[[], None],
        notified: Callable[[str], None] | None = None,
        after_read: Callable[[], Awaitable[None]] | None = None,
        rotate_after: float = 600.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        on_state: Callable[[bool], None] = lambda connected: None,
    ) -> None:
        self._conninfo = conninfo
        self._wake = wake
        self._notified = notified or (lambda payload: wake())
        self._after_read = after_read
        self._handled = asyncio.Event()  # set while no read is being handled
        self._handled.set()
        self._rotate_after = rotate_after
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._on_state = on_state
        self.connected = False
        self.connects = 0

    async def run(self) -> None:
        """Listen until cancelled; never raises on connection trouble."""
        backoff = self._initial_backoff
        while True:
            connects_before = self.connects
            try:
                await self._listen_once()
            except (psycopg.Error, OSError) as exc:
                if self.connects > connects_before:  # it was up: start the backoff over
                    backoff = self._initial_backoff
                log.warning(
                    "outbox listener disconnected (%s); polling until it reconnects in %.0f s",
                    _first_line(exc),
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            else:
                backoff = self._initial_backoff

    async def _listen_once(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo,
            autocommit=True,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            application_name="outbox-dispatcher-listener",
        )
        try:
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.connects += 1
            self._set_connected(True)
            self._wake()
            rotate_at = time.monotonic() + self._rotate_after
            while (left := rotate_at - time.monotonic()) > 0:
                # stop_after=1 ends the iteration with the notifications of one read
                payloads = [n.payload async for n in conn.notifies(timeout=left, stop_after=1)]
                if payloads:
                    await self._handle(payloads)
            log.debug("rotating the outbox listener connection")
        finally:
            self._set_connected(False)
            await conn.close()

    async def _handle(self, payloads: list[str]) -> None:
        self._handled.clear()
        try:
            for payload in payloads:
                self._notified(payload)
            if self._after_read is not None:
                await self._after_read()
        finally:
            self._handled.set()

    async def quiesce(self) -> None:
        """Return once no read is being handled (cancel the listener right after)."""
        await self._handled.wait()

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._on_state(connected)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
