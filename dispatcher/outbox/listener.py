"""The LISTEN side of the enqueuer: a dedicated connection that hands on each NOTIFY.

LISTEN is session state, so it never runs on a pooled connection: this holds
its own autocommit connection, reconnects with backoff (1 s doubling to 30 s)
and rotates it periodically (so a silently half-dead TCP session cannot
linger). After every (re)connect it wakes the enqueuer once, to catch rows
committed while nobody was listening; with the poll fallback, a lost
notification can delay a dispatch but never lose it.

Each read's notifications go to ``notified`` and then ``after_read`` is
awaited, in the listener's own task (``run``), one read after the other, in
order: the idle path publishes there, so a notification's row goes out
without a turn of the event loop in between. With ``publish_now`` the
connection lives in a thread of its own instead, blocked on its socket: a
notification wakes that thread, not the event loop (whose wake-up, task
switches and awaits cost more than the whole publish on an idle machine),
and the thread gives each read to ``publish_now`` first (the idle path
publishes there, ``NotifiedRows.publish_now``); only what that leaves goes
on to ``run``'s task as above. Without ``publish_now`` there is no thread: a
hop from a thread to the event loop would only add its own wake-up.
``quiesce`` waits until no read is being handled, in the thread or the task,
so a shutdown lets its publish finish.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

__all__ = ["NOTIFY_CHANNEL", "OutboxListener"]

NOTIFY_CHANNEL = "outbox_new"

log = logging.getLogger(__name__)

_CONNECT: dict[str, Any] = {
    "autocommit": True,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "application_name": "outbox-dispatcher-listener",
}
# The longest the thread waits on its socket before it looks whether it should stop.
_STOP_POLL = 0.25


class OutboxListener:
    def __init__(
        self,
        *,
        conninfo: str,
        wake: Callable[[], None],
        notified: Callable[[str], None] | None = None,
        after_read: Callable[[], Awaitable[None]] | None = None,
        publish_now: Callable[[list[str]], list[str]] | None = None,
        rotate_after: float = 600.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        on_state: Callable[[bool], None] = lambda connected: None,
    ) -> None:
        self._conninfo = conninfo
        self._wake = wake
        self._notified = notified or (lambda payload: wake())
        self._after_read = after_read
        self._publish_now = publish_now
        self._handled = asyncio.Event()  # set while the event loop handles no read
        self._handled.set()
        self._reads: asyncio.Queue[list[str]] = asyncio.Queue()  # from the thread, if any
        self._quiet = threading.Event()  # set while the thread handles no read
        self._quiet.set()
        self._rotate_after = rotate_after
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._on_state = on_state
        self.connected = False
        self.connects = 0

    async def run(self) -> None:
        """Listen until cancelled; never raises on connection trouble."""
        if self._publish_now is None:
            await self._run_in_loop()
        else:
            await self._run_in_thread()

    async def _run_in_loop(self) -> None:
        backoff = self._initial_backoff
        while True:
            connects_before = self.connects
            try:
                await self._listen_in_loop()
            except (psycopg.Error, OSError) as exc:
                if self.connects > connects_before:  # it was up: start the backoff over
                    backoff = self._initial_backoff
                _disconnected(exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            else:
                backoff = self._initial_backoff

    async def _listen_in_loop(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **_CONNECT)
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

    async def _run_in_thread(self) -> None:
        loop = asyncio.get_running_loop()
        reads = self._reads
        stop = threading.Event()
        ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        thread = threading.Thread(
            target=self._thread_main, args=(loop, reads, stop, ended), name="outbox-listener"
        )
        thread.daemon = True  # never holds the process up; run() stops it on the way out
        thread.start()
        try:
            while True:
                payloads = await reads.get()
                try:
                    await self._handle(payloads)
                finally:
                    reads.task_done()
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wrap_future(ended)

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
        if not self._quiet.is_set():
            await asyncio.to_thread(self._quiet.wait)
        # What the thread handed on was queued before it went quiet (both through the loop).
        await self._reads.join()
        await self._handled.wait()

    # The thread's side. Everything it tells the event loop goes through call_soon_threadsafe.

    def _thread_main(
        self,
        loop: asyncio.AbstractEventLoop,
        reads: asyncio.Queue[list[str]],
        stop: threading.Event,
        ended: concurrent.futures.Future[None],
    ) -> None:
        backoff = self._initial_backoff
        try:
            while not stop.is_set():
                connects_before = self.connects
                try:
                    self._listen_in_thread(loop, reads, stop)
                except (psycopg.Error, OSError) as exc:
                    if self.connects > connects_before:  # it was up: start the backoff over
                        backoff = self._initial_backoff
                    _disconnected(exc, backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, self._max_backoff)
                else:
                    backoff = self._initial_backoff
        except BaseException:
            log.exception("the outbox listener's thread failed; the poll goes on")
        finally:
            ended.set_result(None)

    def _listen_in_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        reads: asyncio.Queue[list[str]],
        stop: threading.Event,
    ) -> None:
        conn = psycopg.connect(self._conninfo, **_CONNECT)
        try:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.connects += 1
            _post(loop, self._set_connected, True)
            _post(loop, self._wake)
            rotate_at = time.monotonic() + self._rotate_after
            while not stop.is_set() and (left := rotate_at - time.monotonic()) > 0:
                # stop_after=1 ends the iteration with the notifications of one read
                wait = min(left, _STOP_POLL)
                payloads = [n.payload for n in conn.notifies(timeout=wait, stop_after=1)]
                if payloads:
                    self._hand_on(loop, reads, payloads)
            if not stop.is_set():
                log.debug("rotating the outbox listener connection")
        finally:
            _post(loop, self._set_connected, False)
            conn.close()

    def _hand_on(
        self, loop: asyncio.AbstractEventLoop, reads: asyncio.Queue[list[str]], payloads: list[str]
    ) -> None:
        self._quiet.clear()
        try:
            rest = self._publish_now(payloads) if self._publish_now is not None else payloads
            if rest:
                _post(loop, reads.put_nowait, rest)
        finally:
            self._quiet.set()

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._on_state(connected)


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` on the event loop; nothing if the loop is closed (exiting)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _disconnected(exc: BaseException, backoff: float) -> None:
    log.warning(
        "outbox listener disconnected (%s); polling until it reconnects in %.0f s",
        _first_line(exc),
        backoff,
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
