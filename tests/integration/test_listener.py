"""The LISTEN connection: every notification handed on in order, rotation, and nothing that
arrives or fails ends it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from dispatcher.outbox.listener import NOTIFY_CHANNEL, OutboxListener
from dispatcher.outbox.loop_signals import LoopSignals
from tests.waiting import eventually


class Received(list[str]):
    """Every payload handed on, in order (what ``NotificationHints`` is in the enqueuer)."""

    def receive(self, payload: str) -> None:
        self.append(payload)


class Rings(LoopSignals):
    """The loop's signals, counting the connections the listener said came up."""

    def __init__(self) -> None:
        super().__init__()
        self.ups = 0

    def heard(self, *, connected: bool) -> None:
        super().heard(connected=connected)
        self.ups += connected


@contextlib.asynccontextmanager
async def running(listener: OutboxListener) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(listener.run())
    try:
        await eventually(lambda: listener.connected, what="the listener connected")
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def notify(url: str, *payloads: str) -> None:
    """One transaction: its notifications reach the listener at its commit."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for payload in payloads:
            await conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, payload))


async def test_every_notification_is_handed_on_in_order(empty_db_url: str) -> None:
    received = Received()
    listener = OutboxListener(conninfo=empty_db_url, hints=received, signals=LoopSignals())
    async with running(listener):
        await notify(empty_db_url, "a", "b", "c")
        await notify(empty_db_url, "d")
        await eventually(lambda: len(received) == 4, what="four notifications read")
    assert received == ["a", "b", "c", "d"]


async def test_hints_that_raise_cost_a_reconnect_never_the_listener(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Fragile(Received):
        def receive(self, payload: str) -> None:
            if payload == "boom":
                raise TypeError("a bug of ours")
            super().receive(payload)

    received = Fragile()
    listener = OutboxListener(
        conninfo=empty_db_url, hints=received, signals=LoopSignals(), initial_backoff=0.05
    )
    async with running(listener) as task:
        await notify(empty_db_url, "boom")
        await eventually(lambda: listener.connects == 2, what="listening again")
        await notify(empty_db_url, "after")
        await eventually(lambda: received == ["after"], what="the next one handed on")
        assert not task.done()
    assert "TypeError: a bug of ours" in caplog.text


async def test_the_connection_rotates_and_wakes_the_enqueuer_each_time(empty_db_url: str) -> None:
    signals = Rings()
    listener = OutboxListener(
        conninfo=empty_db_url, hints=Received(), signals=signals, rotate_after=0.2
    )
    async with running(listener):
        await eventually(lambda: listener.connects >= 3, what="three connections")
        assert signals.ups >= listener.connects - 1  # one wake-up per connection
        assert signals.listening
