"""``eventually`` and its sync twin: the value once the check holds, a reason if it never does."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import eventually, eventually_sync


def test_returns_the_first_truthy_result() -> None:
    calls = itertools.count()
    assert eventually_sync(lambda: next(calls) >= 3 and "done", interval=0) == "done"


def test_fails_naming_what_it_waited_for_chained_to_the_last_ignored_error() -> None:
    def refuses() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="the server answers") as failure:
        eventually_sync(
            refuses, within=0.1, interval=0, ignoring=(ConnectionError,), what="the server answers"
        )
    assert isinstance(failure.value.__cause__, ConnectionError)


def test_an_error_it_was_not_told_to_ignore_ends_the_wait_at_once() -> None:
    calls = itertools.count()

    def broken() -> bool:
        next(calls)
        raise KeyError("bug in the check")

    with pytest.raises(KeyError):
        eventually_sync(broken, within=60, ignoring=(ConnectionError,))
    assert next(calls) == 1


async def test_the_async_twin_awaits_coroutine_checks_and_calls_plain_ones() -> None:
    calls = itertools.count()

    async def later() -> int:
        return next(calls) >= 2 and 7

    assert await eventually(later, interval=0) == 7
    assert await eventually(lambda: "plain", interval=0) == "plain"
    with pytest.raises(AssertionError, match="later"):
        await eventually(lambda: None, within=0.1, what="later")
