"""The LISTEN connection: every notification handed on in order, rotation, and nothing that
arrives or fails ends it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from dispatcher.outbox.listener import NOTIFY_CHANNEL, OutboxListener
from tests.waiting import eventually


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
    received: list[str] = []
    listener = OutboxListener(conninfo=empty_db_url, wake=lambda: None, notified=received.append)
    async with running(listener):
        await notify(empty_db_url, "a", "b", "c")
        await notify(empty_db_url, "d")
        await eventually(lambda: len(received) == 4, what="four notifications read")
    assert received == ["a", "b", "c", "d"]


async def test_a_callback_that_raises_costs_a_reconnect_never_the_listener(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[str] = []

    def notified(payload: str) -> None:
        if payload == "boom":
            raise TypeError("a bug of ours")
        received.append(payload)

    listener = OutboxListener(
        conninfo=empty_db_url, wake=lambda: None, notified=notified, initial_backoff=0.05
    )
    async with running(listener) as task:
        await notify(empty_db_url, "boom")
        await eventually(lambda: listener.connects == 2, what="listening again")
        await notify(empty_db_url, "after")
        await eventually(lambda: received == ["after"], what="the next one handed on")
        assert not task.done()
    assert "TypeError: a bug of ours" in caplog.text


async def test_the_connection_rotates_and_wakes_the_enqueuer_each_time(empty_db_url: str) -> None:
    wakes: list[None] = []
    listener = OutboxListener(
        conninfo=empty_db_url,
        wake=lambda: wakes.append(None),
        notified=lambda payload: None,
        rotate_after=0.2,
    )
    async with running(listener):
        await eventually(lambda: listener.connects >= 3, what="three connections")
        assert len(wakes) >= listener.connects - 1  # one wake-up per connection
