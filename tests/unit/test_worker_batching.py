"""The worker's batching parts without Redis: coalesced writes and slot taking."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.slots import SlotPool


async def _until(check: object) -> None:
    for _ in range(100):
        if callable(check) and check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met after 100 loop turns")


async def test_requests_made_together_are_one_write_with_results_in_order() -> None:
    writes: list[list[int]] = []

    async def write(items: list[int]) -> list[int]:
        writes.append(items)
        return [item * 10 for item in items]

    joined = Coalescer(write, name="test")
    results = await asyncio.gather(joined.submit([1, 2]), joined.submit([3]), joined.submit([]))

    assert results == [[10, 20], [30], []]
    assert writes == [[1, 2, 3]]


async def test_requests_made_during_a_write_go_out_together_next() -> None:
    writes: list[list[int]] = []
    gate = asyncio.Event()

    async def write(items: list[int]) -> list[int]:
        writes.append(items)
        await gate.wait()
        return items

    joined = Coalescer(write, name="test")
    first = asyncio.create_task(joined.submit([1]))
    await _until(lambda: writes == [[1]])
    later = [asyncio.create_task(joined.submit([n])) for n in (2, 3)]
    await _until(lambda: len(joined._queue) == 2)
    gate.set()

    assert [await first, *[await t for t in later]] == [[1], [2], [3]]
    assert writes == [[1], [2, 3]]


async def test_a_failed_write_fails_every_request_in_it() -> None:
    async def write(items: list[int]) -> list[int]:
        raise ConnectionError("redis is down")

    joined = Coalescer(write, name="test")
    results = await asyncio.gather(joined.submit([1]), joined.submit([2]), return_exceptions=True)

    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    with pytest.raises(ConnectionError):
        await joined.submit([3])  # the next write is tried afresh


async def test_closing_cancels_requests_not_written() -> None:
    gate = asyncio.Event()

    async def write(items: list[int]) -> list[int]:
        await gate.wait()
        return items

    joined = Coalescer(write, name="test")
    pending = asyncio.create_task(joined.submit([1]))
    await _until(lambda: joined._flusher is not None)
    await joined.aclose()
    with pytest.raises(asyncio.CancelledError):
        await pending


async def test_take_grabs_what_is_free_now_and_yields_to_waiters() -> None:
    pool = SlotPool(3)
    assert pool.take(5) == 3
    assert pool.take(1) == 0
    waiter = asyncio.create_task(pool.acquire())
    await _until(lambda: pool._waiters)
    pool.release()  # handed to the waiter, not freed
    assert (pool.held, pool.take(1)) == (3, 0)
    await waiter
    pool.release()
    assert (pool.held, pool.take(2)) == (2, 1)


async def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    pool = SlotPool(1)
    await pool.acquire()
    first = asyncio.create_task(pool.acquire())
    second = asyncio.create_task(pool.acquire())
    await _until(lambda: len(pool._waiters) == 2)
    pool.release()  # first gets it...
    first.cancel()  # ...but is cancelled before it runs: second must get it
    await asyncio.gather(first, return_exceptions=True)
    await second
    assert pool.held == 1
