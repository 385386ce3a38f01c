"""Garbage in a control key never stops a queue: each key and kind of garbage, at start and running.

Every value the workers read from Redis besides the task entries — a queue's limits and
their state (slots held, workers alive, the token bucket), the shard count, the cancelled
runs and their signal, an attempt's key — may be written by anyone holding a worker's
credential (a handler) or by hand. Each is filled with bytes that are not UTF-8, a key of
the wrong type, or a value that is not a number, while a worker of two queues runs (one
limited, one not) and before it starts: every task of both queues is still handled, and a
problem is logged once, not on every read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.cli.main import main
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import publish_shard_count
from dispatcher.stream.cancel_keys import CANCEL_SIGNAL, CANCELLED_RUNS
from dispatcher.stream.limit_keys import (
    QueueLimits,
    alive_key,
    held_key,
    limits_key,
    tokens_key,
    write_limits,
)
from dispatcher.stream.naming import SHARDS_KEY, dead_letter_stream
from dispatcher.stream.shard_count import REFRESH_EVERY
from dispatcher.worker import Worker
from dispatcher.worker.dedup import attempt_key
from tests.data import insert_rows, publish, tasks
from tests.enqueuers import make_enqueuer
from tests.enqueuers import running as enqueuers_running
from tests.outbox_rows import outbox_status
from tests.waiting import eventually
from tests.workers import FAST, recorder, running

LIMITED, FREE = "lim", "free"
SHARDS = 2
Poison = Callable[[RedisClient], Awaitable[Any]]


def _first_task_key() -> str:
    return attempt_key("run-poison:t-poison-0:1")


# (key, kind) -> how to write that garbage
GARBAGE: dict[str, Poison] = {
    "limits-bad-bytes": lambda r: r.set(limits_key(LIMITED), b'{"max_in_flight": 2}\xff'),
    "limits-wrong-type": lambda r: _replace_with_hash(r, limits_key(LIMITED)),
    "limits-non-number": lambda r: r.set(limits_key(LIMITED), '{"max_in_flight": "many"}'),
    "held-bad-bytes": lambda r: r.hset(held_key(LIMITED), "ghost", b"\xff\xfe"),
    "held-wrong-type": lambda r: r.set(held_key(LIMITED), "not a hash"),
    "held-non-number": lambda r: r.hset(held_key(LIMITED), "ghost", "lots"),
    "alive-wrong-type": lambda r: r.set(alive_key(LIMITED), "not a sorted set"),
    "alive-bad-bytes": lambda r: r.zadd(alive_key(LIMITED), {b"\xff\xfe": 1e15}),
    "tat-bad-bytes": lambda r: r.set(tokens_key(LIMITED), b"\xff\xfe"),
    "tat-wrong-type": lambda r: _replace_with_hash(r, tokens_key(LIMITED)),
    "tat-non-number": lambda r: r.set(tokens_key(LIMITED), "soon"),
    "tat-far-future": lambda r: r.set(tokens_key(LIMITED), "1e18"),
    "shards-bad-bytes": lambda r: r.set(SHARDS_KEY, b"\xff\xfe"),
    "shards-wrong-type": lambda r: _replace_with_hash(r, SHARDS_KEY),
    "shards-non-number": lambda r: r.set(SHARDS_KEY, "four"),
    "cancels-wrong-type": lambda r: r.set(CANCELLED_RUNS, "not a sorted set"),
    "cancels-bad-bytes": lambda r: r.zadd(CANCELLED_RUNS, {b"\xff\xfe": 1e15}),
    "signal-wrong-type": lambda r: r.set(CANCEL_SIGNAL, "not a stream"),
    "attempt-wrong-type": lambda r: r.hset(_first_task_key(), "x", "y"),
    "attempt-bad-bytes": lambda r: r.set(_first_task_key(), b"\xff|\xfe|99"),
    "attempt-non-number": lambda r: r.set(_first_task_key(), "many|who|when"),
}


async def _replace_with_hash(client: RedisClient, key: str) -> None:
    await client.delete(key)
    await client.hset(key, "x", "y")  # type: ignore[misc]


def _config() -> Any:
    import dataclasses

    return dataclasses.replace(FAST, queues=(LIMITED, FREE), shards=SHARDS, lease_ttl=1.0)


async def _handled_all(client: RedisClient, seen: list[str], prefix: str, count: int = 6) -> None:
    batch = [*tasks(LIMITED, count, prefix=prefix), *tasks(FREE, count, prefix=f"{prefix}f")]
    await publish(client, batch, shards=SHARDS)
    want = {t.task_id for t in batch}
    await eventually(lambda: want <= set(seen), within=20, what=f"every task of {prefix}")


@pytest.mark.parametrize("when", ["running", "at-start"])
@pytest.mark.parametrize("garbage", sorted(GARBAGE))
async def test_garbage_in_a_control_key_stops_no_queue(
    redis_standalone: RedisClient, garbage: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis_standalone
    await publish_shard_count(client, SHARDS)
    await write_limits(client, LIMITED, QueueLimits(max_in_flight=2, rate=200.0, burst=10))
    seen: list[str] = []
    worker = Worker(client, recorder(seen), _config())
    if when == "at-start":
        await GARBAGE[garbage](client)
    with caplog.at_level(logging.WARNING):
        async with running(worker):
            await _handled_all(client, seen, "before")
            if when == "running":
                await GARBAGE[garbage](client)
            await _handled_all(client, seen, "poison", count=1)
            await _handled_all(client, seen, "after")
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("crashed" in p for p in problems), problems
    repeated = {p for p in problems if problems.count(p) > 1}
    assert not repeated, f"said more than once: {repeated}"


@pytest.mark.parametrize("when", ["running", "at-start"])
@pytest.mark.parametrize("garbage", sorted(k for k in GARBAGE if k.startswith("shards-")))
async def test_garbage_in_the_shard_count_never_stops_the_enqueuer(
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    garbage: str,
    when: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = redis_standalone
    await publish_shard_count(client, SHARDS)
    if when == "at-start":
        await GARBAGE[garbage](client)
    enqueuer = make_enqueuer(pool, client, poll_interval=0.05)
    with caplog.at_level(logging.WARNING):
        async with enqueuers_running(enqueuer):
            insert_rows(outbox_db_url, 5, queue=FREE, prefix="before-")
            await eventually(lambda: not outbox_status(outbox_db_url), within=20)
            if when == "running":
                await GARBAGE[garbage](client)
            for n in range(3):  # across a few refreshes of the count
                insert_rows(outbox_db_url, 5, queue=FREE, prefix=f"after{n}-")
                await eventually(lambda: not outbox_status(outbox_db_url), within=20)
                await asyncio.sleep(REFRESH_EVERY)
    entries = sum(
        [await client.xlen(f"workflow.tasks.{FREE}.{s}") for s in range(8)]
    )  # 4 by default
    assert entries == 20
    assert await client.xlen(dead_letter_stream(FREE)) == 0
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    repeated = {p for p in problems if problems.count(p) > 1}
    assert not repeated, f"said more than once: {repeated}"


REPORTED = sorted(
    k for k in GARBAGE if k.split("-")[0] in {"limits", "held", "alive", "tat", "shards"}
)


@pytest.mark.parametrize("garbage", REPORTED)
def test_the_reports_show_garbage_and_end_well(
    redis_url: str,
    outbox_db_url: str,
    garbage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def poison() -> None:
        client = connect_redis(redis_url)
        await publish_shard_count(client, SHARDS)
        await write_limits(client, LIMITED, QueueLimits(max_in_flight=2, rate=200.0, burst=10))
        await GARBAGE[garbage](client)
        await client.aclose()

    asyncio.run(poison())
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", outbox_db_url)
    for command in (["limits"], ["limits", "--json"], ["shards"], ["status"], ["status", "--json"]):
        assert main(command) == 0, (command, capsys.readouterr())
    shown = capsys.readouterr().out
    if garbage.startswith(("limits-", "shards-")):
        assert "INVALID" in shown or "must be an integer" in shown or "invalid" in shown, shown
