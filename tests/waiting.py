"""Wait for a condition with a deadline, never a guessed sleep: ``eventually`` and its sync twin.

Both poll ``check()`` until it returns something truthy and return that value;
at the deadline they raise ``AssertionError`` naming ``what`` was awaited (from
the last exception of the ``ignoring`` types, if one was raised), so a test
fails with a reason instead of hanging. Any other exception ends the wait at
once. What a round's error means and when to give up live in ``_Attempts``;
the two loops differ only in how they call and how they sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

__all__ = ["eventually", "eventually_sync"]

T = TypeVar("T")


class _Attempts:
    """One wait: the deadline, the last ignored error, and the verdict of each round."""

    def __init__(
        self, what: str, *, within: float, ignoring: tuple[type[BaseException], ...]
    ) -> None:
        self.what = what
        self.within = within
        self.ignoring = ignoring
        self.deadline = time.monotonic() + within
        self.error: BaseException | None = None

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """One call of the check: an error of the ``ignoring`` types counts as "not yet"."""
        try:
            yield
        except self.ignoring as exc:
            self.error = exc

    def give_up(self) -> None:
        """Raise once the deadline has passed; return to try again."""
        if time.monotonic() > self.deadline:
            raise AssertionError(f"not within {self.within}s: {self.what}") from self.error


def _name(check: object) -> str:
    return str(getattr(check, "__qualname__", check))


async def eventually(
    check: Callable[[], Awaitable[T]] | Callable[[], T],
    *,
    within: float = 15.0,
    interval: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
    what: str = "",
) -> T:
    """Await (or call) ``check()`` until its result is truthy; return that result."""
    attempts = _Attempts(what or _name(check), within=within, ignoring=ignoring)
    while True:
        with attempts.round():
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
        attempts.give_up()
        await asyncio.sleep(interval)


def eventually_sync(
    check: Callable[[], T],
    *,
    within: float = 15.0,
    interval: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
    what: str = "",
) -> T:
    """Call ``check()`` until its result is truthy; return that result."""
    attempts = _Attempts(what or _name(check), within=within, ignoring=ignoring)
    while True:
        with attempts.round():
            result = check()
            if result:
                return result
        attempts.give_up()
        time.sleep(interval)
