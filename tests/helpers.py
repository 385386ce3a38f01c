"""Small async helpers shared by tests: wait for a condition, never a guessed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def poll(fetch: Callable[[], Awaitable[T]], *, within: float = 15.0) -> T:
    """Await ``fetch()`` until its result is truthy; return the last result at the deadline."""
    deadline = time.monotonic() + within
    while True:
        result = await fetch()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 15.0) -> None:
    """Fail unless ``check()`` becomes true before ``within`` seconds."""
    if not await poll(check, within=within):
        raise AssertionError(f"condition not met within {within}s")
