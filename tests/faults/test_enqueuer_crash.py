"""The enqueuer killed, paused and terminated mid-drain: nothing lost, nothing stolen.

Each test runs ``dispatcher enqueuer`` as a real process and hits it with a
real signal. Redis is the test's own server; PostgreSQL is a fresh database.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.demo.throwaway import RedisProcess, free_port
from dispatcher.outbox import OutboxEnqueuer, OutboxRepository
from dispatcher.outbox.repository import Recovery
from dispatcher.redis_client import connect_redis
from dispatcher.stream import RedisStreamPublisher
from tests.data import insert_rows
from tests.enqueuers import make_enqueuer, metric, spawn_enqueuer
from tests.outbox_rows import outbox_status, published
from tests.waiting import eventually

BLOCK_DELETES = """
CREATE OR REPLACE FUNCTION test_block_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(4242);  -- held by the test: the DELETE waits here
    RETURN OLD;
END $$;
CREATE TRIGGER test_block_delete BEFORE DELETE ON outbox
    FOR EACH ROW EXECUTE FUNCTION test_block_delete();
"""


def stop(proc: Any) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


async def test_sigkill_between_publish_and_delete_republishes_and_loses_nothing(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_process: RedisProcess, tmp_path: Path
) -> None:
    queue = f"k{uuid.uuid4().hex[:8]}"
    ids = insert_rows(outbox_db_url, 30, queue=queue)
    with psycopg.connect(outbox_db_url, autocommit=True) as blocker:
        blocker.execute(BLOCK_DELETES)
        blocker.execute("SELECT pg_advisory_lock(4242)")
        proc = spawn_enqueuer(outbox_db_url, redis_process.url, tmp_path / "a.log", "--no-listen")
        try:
            client = connect_redis(redis_process.url)
            # Published, and its DELETE is stuck behind our lock: the crash window.
            await eventually(lambda: _count(client, queue, 30))
            assert outbox_status(outbox_db_url) == {"PENDING": 30}  # locked by the open batch
            assert (await OutboxRepository(pool).status_counts()).in_flight == 30
            proc.kill()
            proc.wait(10)
        finally:
            stop(proc)
        blocker.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'outbox-dispatcher-enqueuer'"
            " AND datname = current_database()"  # never another test's or a benchmark's
        )
        blocker.execute("DROP TRIGGER test_block_delete ON outbox")
    assert outbox_status(outbox_db_url) == {"PENDING": 30}, "the batch rolled back: nothing deleted"

    rescuer = make_enqueuer(pool, client, hung_batch_timeout=0.5, publish_timeout=0.2)
    await eventually(lambda: _recover(rescuer.maintenance_once(), outbox_db_url, 30))
    await eventually(lambda: _probe_all(rescuer, outbox_db_url))  # suspects go one at a time

    seen = collections.Counter(e["outbox_id"] for e in await published(client, queue))
    assert set(seen) == set(ids), "nothing lost"
    assert sorted(seen.values()) == [2] * 30, "each row duplicated once by the crash"
    assert outbox_status(outbox_db_url) == {}
    with psycopg.connect(outbox_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_dlq").fetchone() == (0,)
    await client.aclose()


async def test_paused_enqueuer_waking_late_touches_nothing_it_no_longer_owns(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_process: RedisProcess, tmp_path: Path
) -> None:
    queue = f"p{uuid.uuid4().hex[:8]}"
    client = connect_redis(redis_process.url)
    port = free_port()
    flags = ["--no-listen", "--poll-interval", "0.05", "--publish-timeout", "1"]
    flags += ["--hung-batch-timeout", "2", "--metrics-port", str(port)]
    proc = spawn_enqueuer(outbox_db_url, redis_process.url, tmp_path / "a.log", *flags)
    repo = OutboxRepository(pool)
    try:
        insert_rows(outbox_db_url, 4, queue=queue, prefix="warm-")  # A learns the streams' groups
        await eventually(lambda: _count(client, queue, 4))

        redis_process.pause()  # A locks a batch and then blocks in its XADD round trip
        ids = insert_rows(outbox_db_url, 20, queue=queue)
        await eventually(lambda: _in_flight(repo, 20))
        os.kill(proc.pid, signal.SIGSTOP)
        redis_process.resume()

        # Past --hung-batch-timeout PostgreSQL ends A's idle transaction: B gets the rows.
        for _ in range(200):
            async with repo.claims.claim_batch(50, hold_for=30) as batch_b:
                if batch_b.rows:
                    break
            await asyncio.sleep(0.05)
        assert sorted(r.id for r in batch_b.rows) == sorted(ids)
        async with repo.claims.claim_batch(50, hold_for=30) as batch_b:
            assert sorted(r.id for r in batch_b.rows) == sorted(ids)
            os.kill(proc.pid, signal.SIGCONT)  # A finishes its batch: the late delete fails
            await eventually(lambda: metric(port, "dispatcher_outbox_unsettled_batches_total") >= 1)
            assert outbox_status(outbox_db_url) == {"PENDING": 20}, (
                "A's late writes touched nothing"
            )

            results = await RedisStreamPublisher(client).publish_many(
                [(r.stream, {"outbox_id": r.id}) for r in batch_b.rows]
            )
            assert all(r.ok for r in results)
            await batch_b.settle([r.id for r in batch_b.rows])
        assert outbox_status(outbox_db_url) == {}
        # A's journal row outlived its transaction; its rows are gone, so nothing to count.
        assert await repo.recover_batches() == Recovery()
    finally:
        stop(proc)
        await client.aclose()


async def test_sigterm_during_a_drain_leaves_no_row_in_flight(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_process: RedisProcess, tmp_path: Path
) -> None:
    queue = f"t{uuid.uuid4().hex[:8]}"
    total = 100_000
    insert_rows(outbox_db_url, total, queue=queue)
    client = connect_redis(redis_process.url)
    proc = spawn_enqueuer(
        outbox_db_url, redis_process.url, tmp_path / "a.log", "--concurrency", "4"
    )
    try:
        await eventually(lambda: _count(client, queue, 2000))
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        stop(proc)
    status = outbox_status(outbox_db_url)
    assert set(status) <= {"PENDING"}, "nothing rescheduled or dead-lettered by the shutdown"
    assert (await OutboxRepository(pool).status_counts()).in_flight == 0
    entries = await published(client, queue)
    assert len(entries) == len({e["outbox_id"] for e in entries}), "no duplicates"
    assert len(entries) + status.get("PENDING", 0) == total, "every row published or pending"
    assert status.get("PENDING", 0) > 0, "stopped mid-drain"
    await client.aclose()


async def _count(client: Any, queue: str, n: int) -> bool:
    return len(await published(client, queue)) >= n


async def _in_flight(repo: OutboxRepository, n: int) -> bool:
    return (await repo.status_counts()).in_flight >= n


async def _recover(recovery: Any, url: str, n: int) -> bool:
    """Run one recovery pass; true once ``n`` rows wait as suspects, uncharged."""
    await recovery
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox WHERE suspect AND attempt_count = 0"
        ).fetchone()
    return row is not None and row[0] >= n


async def _probe_all(enqueuer: OutboxEnqueuer, url: str) -> bool:
    """Claim due suspects alone until none is due; true once the outbox is empty."""
    while await enqueuer.pipeline.run(probe=True):
        pass
    return outbox_status(url) == {}
