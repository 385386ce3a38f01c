"""The shard count: one owner, routed when published, followed live by enqueuers and workers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher import enqueue_dispatch
from dispatcher.redis_client import RedisClient
from dispatcher.stream import (
    SHARDS_KEY,
    dead_letter_stream,
    publish_shard_count,
    shard_for,
    task_stream,
)
from dispatcher.worker import Worker
from tests import workers
from tests.data import dispatch, insert_rows, publish, tasks
from tests.enqueuers import make_enqueuer, running, spawn_enqueuer
from tests.outbox_rows import outbox_status
from tests.waiting import eventually


def ids_on_shards(prefix: str, *, shards: int, among: set[int], n: int) -> list[str]:
    """``n`` task ids whose shard under ``shards`` is one of ``among``."""
    found = (f"{prefix}-{i}" for i in range(100_000))
    return [t for t in found if shard_for(t, shards) in among][:n]


def cli(
    *args: str, db_url: str, redis_url: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAM_SHARDS"}
    return subprocess.run(
        [
            sys.executable,
            *("-m", "dispatcher.cli"),
            *args,
            *("--database-url", db_url, "--redis-url", redis_url),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def fast_worker(client: RedisClient, queue: str, seen: list[str], name: str = "w1") -> Worker:
    return Worker(client, workers.recorder(seen), workers.config(queue, consumer=name))


# -- one owner --------------------------------------------------------------------------------


async def test_enqueuer_started_without_stream_shards_leaves_the_key_at_8(
    outbox_db_url: str,
    redis_url: str,
    redis_standalone: RedisClient,
    queue: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAM_SHARDS", raising=False)
    await redis_standalone.set(SHARDS_KEY, "8")
    insert_rows(outbox_db_url, 3, queue=queue)
    proc = spawn_enqueuer(
        outbox_db_url, redis_url, tmp_path / "enqueuer.log", "--poll-interval", "0.1"
    )
    try:

        async def published() -> bool:  # the enqueuer is past its start-up
            return outbox_status(outbox_db_url) == {}

        await eventually(published, within=30)
        assert await redis_standalone.get(SHARDS_KEY) == "8"
    finally:
        proc.terminate()
        proc.wait(30)


async def test_first_enqueuer_writes_the_key_when_it_is_absent(
    outbox_db_url: str,
    redis_url: str,
    redis_standalone: RedisClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAM_SHARDS", "3")
    proc = spawn_enqueuer(
        outbox_db_url, redis_url, tmp_path / "enqueuer.log", "--poll-interval", "0.1"
    )
    try:

        async def written() -> bool:
            return await redis_standalone.get(SHARDS_KEY) == "3"

        await eventually(written, within=30)
    finally:
        proc.terminate()
        proc.wait(30)


# -- routed when published --------------------------------------------------------------------


async def test_enqueue_dispatch_without_shards_is_handled_when_the_key_says_2(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 2)
    # Ids the default of 4 would put on shards 2 and 3, which nobody reads at 2 shards.
    ids = ids_on_shards(queue, shards=4, among={2, 3}, n=6)
    with psycopg.connect(outbox_db_url) as conn:
        for task_id in ids:
            enqueue_dispatch(conn, dispatch(task_id, queue))
    seen: list[str] = []
    enqueuer = make_enqueuer(pool, redis_standalone, poll_interval=0.1)
    async with workers.running(fast_worker(redis_standalone, queue, seen)), running(enqueuer):

        async def handled() -> bool:
            return set(seen) == set(ids)

        await eventually(handled, within=30)
    assert outbox_status(outbox_db_url) == {}


def test_shards_argument_is_accepted_with_a_deprecation_warning(
    outbox_db_url: str, queue: str
) -> None:
    with psycopg.connect(outbox_db_url) as conn, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enqueue_dispatch(conn, dispatch("t1", queue), shards=8)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with psycopg.connect(outbox_db_url) as conn:
        (stream,) = conn.execute("SELECT stream FROM outbox").fetchone() or ("",)
    assert stream == f"workflow.tasks.{queue}"


async def test_rows_of_older_writers_follow_the_current_count(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 2)
    ids = insert_rows(
        outbox_db_url, 40, queue=queue, shards=8
    )  # stored as workflow.tasks.<q>.<0..7>
    enqueuer = make_enqueuer(pool, redis_standalone, poll_interval=0.1)
    async with running(enqueuer):
        await eventually(lambda: _empty(outbox_db_url), within=30)
    where = {}
    for shard in range(8):
        for _id, fields in await redis_standalone.xrange(task_stream(queue, shard)):
            where[fields["task_id"]] = shard
    assert where == {t: shard_for(t, 2) for t in ids}


async def _empty(db_url: str) -> bool:
    return outbox_status(db_url) == {}


async def test_a_count_written_directly_is_in_force_for_publishing(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 4)
    enqueuer = make_enqueuer(pool, redis_standalone, poll_interval=0.1)
    async with running(enqueuer):
        await redis_standalone.set(SHARDS_KEY, "8")  # as the operator does: no restart, no env
        # Ids that land on shards 4..7 at 8 shards, and on 0..3 at 4.
        ids = iter(ids_on_shards(queue, shards=8, among={4, 5, 6, 7}, n=10_000))

        async def routed_by_8() -> bool:
            task_id = next(ids)
            with psycopg.connect(outbox_db_url) as conn:
                enqueue_dispatch(conn, dispatch(task_id, queue))
            await eventually(lambda: _empty(outbox_db_url), within=30)
            return bool(await redis_standalone.xlen(task_stream(queue, shard_for(task_id, 8))))

        await eventually(routed_by_8, within=60)


async def test_live_count_is_cached_and_refreshed_every_few_seconds(
    redis_standalone: RedisClient,
) -> None:
    from dispatcher.stream.shard_count import LiveShardCount

    now = [100.0]
    live = LiveShardCount(redis_standalone, fallback=4, clock=lambda: now[0])
    assert live.refresh_every <= 5.0  # a direct write is in force within 5 s
    assert await live.current() == 4  # unset: the fallback
    await redis_standalone.set(SHARDS_KEY, "8")
    assert await live.current() == 4  # cached
    now[0] += live.refresh_every
    assert await live.current() == 8
    await redis_standalone.set(SHARDS_KEY, "bogus")
    now[0] += live.refresh_every
    assert await live.current() == 8  # a bad value keeps the last good one, never a guess


# -- read until empty ---------------------------------------------------------------------------


async def test_workers_read_removed_shards_that_still_hold_entries(
    any_redis: RedisClient, queue: str
) -> None:
    await publish_shard_count(any_redis, 2)
    left_over = tasks(queue, 20)
    await publish(any_redis, left_over, shards=8)  # entries on shards 0..7, count now 2
    seen: list[str] = []
    async with workers.running(fast_worker(any_redis, queue, seen)):

        async def handled() -> bool:
            return set(seen) == {t.task_id for t in left_over}

        await eventually(handled, within=30)


async def test_running_workers_pick_up_an_increase_and_a_late_entry_on_a_removed_shard(
    any_redis: RedisClient, queue: str
) -> None:
    await publish_shard_count(any_redis, 2)
    seen: list[str] = []
    worker = fast_worker(any_redis, queue, seen)
    async with workers.running(worker):
        await publish_shard_count(any_redis, 5)
        more = tasks(queue, 20)
        await publish(any_redis, more, shards=5)

        async def handled() -> bool:
            return set(seen) == {t.task_id for t in more}

        await eventually(handled, within=30)
        # A writer that still had an old, larger count publishes to shard 7 after a decrease.
        await publish_shard_count(any_redis, 2)
        late = [t for t in tasks(queue, 200) if shard_for(t.task_id, 8) == 7][:3]
        await publish(any_redis, late, shards=8)

        async def late_handled() -> bool:
            return {t.task_id for t in late} <= set(seen)

        await eventually(late_handled, within=30)
        assert task_stream(queue, 7) in worker.streams


# -- dead letters -------------------------------------------------------------------------------


async def test_dead_letter_replay_routes_by_the_current_count(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 2)
    task_id = ids_on_shards(queue, shards=2, among={1}, n=1)[0]
    await redis_standalone.xadd(
        dead_letter_stream(queue),
        {
            "task_id": task_id,
            "error": "boom",
            "delivery_count": "5",
            "runs": "5",
            "source_stream": task_stream(queue, 6),
            "source_id": "1-1",
        },
    )
    out = cli("dlq", "replay", "--queue", queue, "--all", db_url=outbox_db_url, redis_url=redis_url)
    assert out.returncode == 0, out.stderr
    assert await redis_standalone.xlen(task_stream(queue, 6)) == 0
    ((_id, fields),) = await redis_standalone.xrange(task_stream(queue, 1))
    assert fields["task_id"] == task_id


# -- the CLI ------------------------------------------------------------------------------------


async def test_shards_command_shows_count_and_each_shard(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 2)
    await publish(redis_standalone, tasks(queue, 10), shards=3)  # shard 2 is left over
    out = cli("shards", db_url=outbox_db_url, redis_url=redis_url)
    assert out.returncode == 0, out.stderr
    assert "shard count: 2" in out.stdout
    for shard in range(3):
        assert task_stream(queue, shard) in out.stdout
    assert "draining" in out.stdout  # shard 2 is beyond the count and not empty


async def test_shards_set_lowers_the_count_and_exits_once_removed_shards_are_empty(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 4)
    work = tasks(queue, 40)
    await publish(redis_standalone, work, shards=4)
    seen: list[str] = []
    async with workers.running(fast_worker(redis_standalone, queue, seen)):
        out = await asyncio.to_thread(
            cli,
            "shards",
            "set",
            "2",
            "--refresh-wait",
            "0.5",
            db_url=outbox_db_url,
            redis_url=redis_url,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert await redis_standalone.get(SHARDS_KEY) == "2"
    for shard in (2, 3):
        assert await redis_standalone.xlen(task_stream(queue, shard)) == 0
    assert "applied" in out.stdout


async def test_shards_set_rejects_a_bad_count(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient
) -> None:
    await publish_shard_count(redis_standalone, 4)
    out = cli("shards", "set", "0", db_url=outbox_db_url, redis_url=redis_url)
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
    assert await redis_standalone.get(SHARDS_KEY) == "4"


async def test_shards_set_reports_progress_and_gives_up_at_its_timeout(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 4)
    left = [t for t in tasks(queue, 100) if shard_for(t.task_id, 4) == 3][:3]
    await publish(redis_standalone, left, shards=4)  # no worker: shard 3 cannot drain
    out = cli(
        "shards",
        "set",
        "2",
        "--refresh-wait",
        "0",
        "--timeout",
        "1",
        "--progress-every",
        "0.2",
        db_url=outbox_db_url,
        redis_url=redis_url,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    stream = task_stream(queue, 3)
    assert (
        f"draining 1 removed shards, 3 entries left: {stream} (length 3, pending 0)" in out.stdout
    )
    assert "still draining after" in out.stdout
    assert await redis_standalone.get(SHARDS_KEY) == "2"  # the change stays; draining goes on
