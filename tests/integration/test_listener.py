"""The LISTEN connection: reads handed on whole, handled in the listener's own task, rotation.

Each holds with the connection on the event loop and in the listener's thread
(``publish_now`` given: here it takes nothing, so every read goes on to the task).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from dispatcher._testing.waiting import eventually
from dispatcher.outbox.listener import NOTIFY_CHANNEL, OutboxListener

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["event loop", "thread"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The listener's keyword arguments for where its connection lives."""
    return {"publish_now": (lambda payloads: payloads)} if request.param == "thread" else {}


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


async def test_each_read_is_handed_on_then_handled_in_the_listeners_task(
    empty_db_url: str, mode: dict[str, Any]
) -> None:
    received: list[str] = []
    reads: list[tuple[list[str], asyncio.Task[object] | None]] = []

    async def after_read() -> None:
        reads.append((list(received), asyncio.current_task()))

    listener = OutboxListener(
        conninfo=empty_db_url,
        wake=lambda: None,
        notified=received.append,
        after_read=after_read,
        **mode,
    )
    async with running(listener) as task:
        await notify(empty_db_url, "a", "b", "c")
        await eventually(lambda: len(received) == 3 and reads, what="three notifications read")
        await notify(empty_db_url, "d")
        await eventually(lambda: reads[-1][0][-1:] == ["d"], what="the fourth handled")
    # after every read, in the listener's own task (no hop to another task), with every
    # notification of that read already handed on
    assert all(handled_by is task for _, handled_by in reads)
    assert received == ["a", "b", "c", "d"]
    assert reads[-1][0] == received
    assert all(seen == received[: len(seen)] for seen, _ in reads)


async def test_quiesce_waits_for_the_read_being_handled(
    empty_db_url: str, mode: dict[str, Any]
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def after_read() -> None:
        entered.set()
        await release.wait()

    listener = OutboxListener(
        conninfo=empty_db_url,
        wake=lambda: None,
        notified=lambda p: None,
        after_read=after_read,
        **mode,
    )
    async with running(listener):
        await listener.quiesce()  # nothing being handled: returns at once
        await notify(empty_db_url, "x")
        await asyncio.wait_for(entered.wait(), 15)
        quiet = asyncio.create_task(listener.quiesce())
        await asyncio.sleep(0.05)
        assert not quiet.done()
        release.set()
        await asyncio.wait_for(quiet, 15)


async def test_the_connection_rotates_and_wakes_the_enqueuer_each_time(
    empty_db_url: str, mode: dict[str, Any]
) -> None:
    wakes: list[None] = []
    listener = OutboxListener(
        conninfo=empty_db_url, wake=lambda: wakes.append(None), rotate_after=0.2, **mode
    )
    async with running(listener):
        await eventually(lambda: listener.connects >= 3, what="three connections")
        assert len(wakes) >= listener.connects - 1  # one wake-up per connection
