"""``dispatcher limits`` and ``dispatcher limits set`` on a real Redis: merge, clear, show."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from dispatcher.cli.main import main
from dispatcher.redis_client import RedisClient
from dispatcher.stream.limit_keys import QueueLimits, limits_key, read_limits

Cli = Callable[..., Awaitable[tuple[int, str]]]


@pytest.fixture
def cli(redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``await cli(*argv)``: ``dispatcher <argv>`` on the test's Redis; its exit code and output."""
    monkeypatch.setenv("REDIS_URL", redis_url)

    async def run(*argv: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, list(argv))
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


async def test_set_merges_the_fields_given_and_clear_removes_them(
    redis_standalone: RedisClient, queue: str, cli: Cli
) -> None:
    steps: list[tuple[list[str], QueueLimits | None]] = [
        (["--max-in-flight", "4"], QueueLimits(max_in_flight=4)),
        (["--rate", "20", "--burst", "5"], QueueLimits(max_in_flight=4, rate=20, burst=5)),
        (["--burst", "3"], QueueLimits(max_in_flight=4, rate=20, burst=3)),
        (["--rate", "0"], QueueLimits(max_in_flight=4)),
        (["--clear", "--rate", "2"], QueueLimits(rate=2)),
        (["--clear"], None),
    ]
    for flags, expected in steps:
        code, said = await cli("limits", "set", "--queue", queue, *flags)
        assert code == 0, said
        assert await read_limits(redis_standalone, queue) == expected


async def test_show_lists_limits_with_their_use_and_names_a_bad_key(
    redis_standalone: RedisClient, queue: str, cli: Cli
) -> None:
    assert (await cli("limits"))[1] == "no queue has limits\n"
    await cli("limits", "set", "--queue", queue, "--max-in-flight", "3", "--rate", "5")
    code, said = await cli("limits")
    assert code == 0
    assert (
        said == f"limits of {queue}: max in flight 3, rate 5/s burst 1; in flight 0/3; tokens 1/1\n"
    )
    code, said = await cli("limits", "--json")
    assert json.loads(said) == [
        {
            "queue": queue,
            "limits": {"max_in_flight": 3, "rate": 5.0},
            "in_use": 0,
            "tokens": 1,
            "error": None,
        }
    ]

    await redis_standalone.set(limits_key(queue), '{"burst": 2}')
    code, said = await cli("limits")
    assert "INVALID (workers keep what they last read)" in said
    assert "burst requires rate" in said
    code, said = await cli("limits", "set", "--queue", queue, "--max-in-flight", "2")
    assert code == 2
    assert "replace them with --clear" in said
    code, said = await cli("limits", "set", "--queue", queue, "--clear", "--rate", "1")
    assert code == 0
    assert await read_limits(redis_standalone, queue) == QueueLimits(rate=1)
