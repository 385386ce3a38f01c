"""``dispatcher status`` and ``dispatcher dlq``: numbers match reality, replays get handled."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.models import TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import (
    RedisStreamConsumer,
    dead_letter_stream,
    publish_shard_count,
    task_stream,
)
from dispatcher.worker import Worker, WorkerConfig, attempt_key
from tests.commands import cli
from tests.data import insert_rows, publish, tasks
from tests.enqueuers import make_enqueuer
from tests.outbox_rows import outbox_status, published
from tests.waiting import eventually


async def test_status_json_matches_what_was_put_in(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    insert_rows(outbox_db_url, 7, queue=queue, prefix="p-")
    insert_rows(outbox_db_url, 3, queue=queue, prefix="r-")
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET status = 'RETRY' WHERE id LIKE 'r-%'")
        conn.execute(
            "INSERT INTO outbox_dlq (id, stream, payload, attempts) "
            "VALUES ('d1', %s, '{}', 6), ('d2', %s, '{}', 6)",
            (task_stream(queue, 0), task_stream(queue, 0)),
        )
    stream = task_stream(queue, 1)
    await publish(redis_standalone, tasks(queue, 5), shards=1)  # 5 entries on shard 0
    reader = RedisStreamConsumer(redis_standalone, task_stream(queue, 0), "workers", "c1")
    assert len(await reader.read_new(2)) == 2  # 2 delivered, unacked
    await redis_standalone.xadd(stream, {"x": "1"})  # shard 1: no group yet
    await redis_standalone.set("composer:stream_shards", "4")

    out = cli("status", "--json", db_url=outbox_db_url, redis_url=redis_url)

    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["outbox"] == {"PENDING": 7, "RETRY": 3, "DLQ": 0, "IN_FLIGHT": 0}
    assert report["dlq"] == 2
    assert report["oldest_pending_age_seconds"] >= 0
    assert report["stream_shards"] == 4
    assert "shard_key" not in report
    by_stream = {s["stream"]: s for s in report["streams"]}
    assert by_stream[task_stream(queue, 0)]["length"] == 5
    assert by_stream[task_stream(queue, 0)]["pending"] == 2
    assert by_stream[task_stream(queue, 0)]["consumers"] == 1
    assert by_stream[stream]["length"] == 1
    assert by_stream[stream]["group_exists"] is False


async def test_outbox_dlq_replay_gets_rows_published_and_handled(
    outbox_db_url: str,
    redis_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
) -> None:
    await publish_shard_count(redis_standalone, 1)  # every row is published to shard 0
    ids = insert_rows(outbox_db_url, 6, queue=queue, max_retries=1, backoff=1)
    await redis_standalone.set(task_stream(queue, 0), "not a stream")  # every publish fails
    enqueuer = make_enqueuer(pool, redis_standalone)
    for _ in range(2):
        await enqueuer.process_batch()
        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            conn.execute("UPDATE outbox SET next_attempt_at = now()")
    assert outbox_status(outbox_db_url) == {"DLQ": 6}
    await redis_standalone.delete(task_stream(queue, 0))  # the cause is fixed

    dry = cli(
        "dlq", "replay", "--id", ids[0], "--dry-run", db_url=outbox_db_url, redis_url=redis_url
    )
    assert dry.stdout.strip() == f"would replay 1: {ids[0]}"
    bad = cli("dlq", "replay", "--id", "nope", db_url=outbox_db_url, redis_url=redis_url)
    assert bad.returncode == 2
    assert "not in outbox_dlq: nope; nothing replayed" in bad.stderr
    some = cli(
        "dlq", "replay", "--id", ids[0], "--id", ids[1], db_url=outbox_db_url, redis_url=redis_url
    )
    assert some.returncode == 0, some.stderr
    rest = cli("dlq", "replay", "--all", db_url=outbox_db_url, redis_url=redis_url)
    assert rest.stdout.startswith("replayed 4:")
    assert outbox_status(outbox_db_url) == {"PENDING": 6}

    await enqueuer.process_batch()
    handled = await _handle_all(redis_standalone, queue, 6)
    assert sorted(handled) == sorted(ids)
    assert outbox_status(outbox_db_url) == {}


async def test_worker_dead_letter_stream_replay(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    dispatches = tasks(queue, 3)
    await publish(redis_standalone, dispatches, shards=1)
    source = task_stream(queue, 0)
    dead = dead_letter_stream(queue)
    for entry_id, fields in await redis_standalone.xrange(source):
        extra = {"error": "boom", "delivery_count": "6", "runs": "5", "source_id": entry_id}
        await redis_standalone.xadd(dead, {**fields, **extra, "source_stream": source})
        await redis_standalone.xdel(source, entry_id)
    for d in dispatches:  # run budgets used up (the worker died before it reset them)
        await redis_standalone.set(attempt_key(f"{d.run_id}:{d.task_id}:{d.attempt}"), "5")

    listing = cli("dlq", "list", "--queue", queue, db_url=outbox_db_url, redis_url=redis_url)
    assert listing.stdout.count("error=boom") == 3
    replay = cli(
        "dlq", "replay", "--queue", queue, "--all", db_url=outbox_db_url, redis_url=redis_url
    )
    assert replay.returncode == 0, replay.stderr
    assert await redis_standalone.xlen(dead) == 0
    entries = await published(redis_standalone, queue, shards=1)
    assert all("error" not in e and "source_id" not in e and "runs" not in e for e in entries)

    handled = await _handle_all(redis_standalone, queue, 3, by="task_id")
    assert sorted(handled) == sorted(d.task_id for d in dispatches)


async def _handle_all(client: RedisClient, queue: str, n: int, by: str = "outbox_id") -> list[str]:
    seen: list[str] = []

    async def handler(message: TaskMessage) -> None:
        seen.append(message.outbox_id if by == "outbox_id" else message.task_id)

    worker = Worker(client, handler, WorkerConfig(queues=(queue,), shards=1, block_ms=100))
    run = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: _at_least(seen, n), within=20)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 30)
    return seen


async def _at_least(items: list[str], n: int) -> bool:
    return len(items) >= n


async def test_journal_rows_of_another_cluster_are_discarded(
    outbox_db_url: str,
    redis_url: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dump/restore brings back a journal row whose transaction id is ahead of this cluster."""
    (row_id,) = insert_rows(outbox_db_url, 1, queue=queue, prefix="restored-")
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_batches (token, xact, ids, enqueuer)"
            " SELECT gen_random_uuid(),"
            "        (pg_current_xact_id()::text::bigint + 100000000)::text::xid8,"
            "        ARRAY[%s], 'another-cluster'",
            (row_id,),
        )
    out = cli("status", "--json", db_url=outbox_db_url, redis_url=redis_url)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outbox"]["IN_FLIGHT"] == 0

    enqueuer = make_enqueuer(pool, redis_standalone)
    with caplog.at_level(logging.WARNING):
        await enqueuer.maintenance_once()
        await enqueuer.maintenance_once()
    warnings = [r for r in caplog.records if "another cluster" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    with psycopg.connect(outbox_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_batches").fetchone() == (0,)
    assert outbox_status(outbox_db_url) == {"PENDING": 1}, "the row itself is not charged"
    await enqueuer.process_batch()
    assert [e["outbox_id"] for e in await published(redis_standalone, queue)] == [row_id]
    out = cli("status", "--json", db_url=outbox_db_url, redis_url=redis_url)
    assert out.returncode == 0, out.stderr


async def test_dlq_delete_of_both_hops_is_all_or_nothing(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str
) -> None:
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_dlq (id, stream, payload, attempts) "
            "SELECT 'd' || g, %s, '{}', 6 FROM generate_series(1, 3) g",
            (task_stream(queue, 0),),
        )
    dead = dead_letter_stream(queue)
    ids = [
        str(await redis_standalone.xadd(dead, {"task_id": f"t{n}", "error": "x"})) for n in range(3)
    ]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return cli("dlq", "delete", *args, db_url=outbox_db_url, redis_url=redis_url)

    missing = run("--id", "d1", "--id", "nope")
    assert missing.returncode == 2
    assert "not in outbox_dlq: nope; nothing deleted" in missing.stderr
    gone = run("--id", "d1", "--id", "d3")
    assert gone.stdout.strip() == "deleted 2: d1 d3"
    with psycopg.connect(outbox_db_url) as conn:
        assert conn.execute("SELECT id FROM outbox_dlq").fetchall() == [("d2",)]

    missing = run("--queue", queue, "--id", ids[0], "--id", "1-99")
    assert missing.returncode == 2
    assert f"not in {dead}: 1-99; nothing deleted" in missing.stderr
    assert run("--queue", queue, "--id", "not-an-id").returncode == 2
    assert await redis_standalone.xlen(dead) == 3
    assert run("--queue", queue, "--id", ids[1]).stdout.strip() == f"deleted 1: {ids[1]}"
    assert run("--queue", queue, "--all").stdout.strip() == f"deleted 2: {ids[0]} {ids[2]}"
    assert await redis_standalone.xlen(dead) == 0
