"""A batch's claim is its transaction's row locks; its journal row survives a crash.

These drive ``BatchClaims`` (``OutboxRepository.claims``) directly (the enqueuer's loop is
covered in test_enqueuer.py and the fault suite): what other claimers see
while a batch is open, what a crash or a timed-out pause leaves behind, and
how recovery turns an unsettled batch into a counted attempt.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import OutboxRepository
from dispatcher.outbox.repository import Recovery
from tests.data import insert_rows
from tests.outbox_rows import outbox_status


def attempts(url: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, status, attempt_count FROM outbox").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def one_session(url: str) -> AsyncConnectionPool[Any]:
    """A pool of one connection: every claim and statement on the same session."""
    return AsyncConnectionPool(url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)


def journal(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_batches").fetchone()
    return int(row[0]) if row else -1


async def test_an_open_batch_hides_its_rows_and_settling_commits_all_of_it(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    ids = insert_rows(outbox_db_url, 30, queue=queue)
    repo = OutboxRepository(pool)
    async with repo.claims.claim_batch(20, hold_for=30) as first:
        assert len(first.rows) == 20
        assert (await repo.status_counts()).in_flight == 20
        async with repo.claims.claim_batch(50, hold_for=30) as second:
            assert len(second.rows) == 10, "SKIP LOCKED: only the rows nobody holds"
            assert not {r.id for r in first.rows} & {r.id for r in second.rows}
        # second left without settling: its rows rolled back, untouched, due again
        sent = [r.id for r in first.rows[:15]]
        await first.settle(sent, [], [])
    assert outbox_status(outbox_db_url) == {"PENDING": 15}
    assert set(attempts(outbox_db_url)) == set(ids) - set(sent)
    assert (await repo.status_counts()).in_flight == 0
    # first settled (its journal row went with the commit); second's is left for recovery
    assert journal(outbox_db_url) == 1
    # Nobody knows which of second's rows (if any) ended it: suspects, none charged.
    assert await repo.recover_batches() == Recovery(suspects=10)
    assert journal(outbox_db_url) == 0
    assert {v for v in attempts(outbox_db_url).values()} == {("PENDING", 0)}


async def test_a_paused_batch_loses_its_session_and_its_late_writes_fail(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    ids = insert_rows(outbox_db_url, 5, queue=queue)
    repo = OutboxRepository(pool)
    async with repo.claims.claim_batch(50, hold_for=0.3) as paused:
        assert len(paused.rows) == 5
        await asyncio.sleep(1.0)  # idle in transaction past hold_for: PostgreSQL ends it
        with pytest.raises(psycopg.Error):  # the session is gone (timeout or lost)
            await paused.settle([r.id for r in paused.rows])  # the late delete
    assert sorted(attempts(outbox_db_url)) == sorted(ids), "the late delete deleted nothing"
    async with repo.claims.claim_batch(50, hold_for=30) as rescuer:
        assert len(rescuer.rows) == 5, "the rows were due again at once"
    assert await repo.recover_batches() == Recovery(suspects=5)
    assert {v for v in attempts(outbox_db_url).values()} == {("PENDING", 0)}
    with psycopg.connect(outbox_db_url) as conn:
        row = conn.execute(
            "SELECT bool_and(suspect), bool_and(next_attempt_at IS NOT NULL) FROM outbox"
        ).fetchone()
    assert row == (True, True), "suspects, scheduled rather than due at once"


CRASH_WHILE_HOLDING = textwrap.dedent(
    """
    import asyncio, os, sys
    from psycopg_pool import AsyncConnectionPool
    from dispatcher.outbox import OutboxRepository

    async def main():
        pool = AsyncConnectionPool(sys.argv[1], kwargs={"autocommit": True}, open=False)
        await pool.open(wait=True)
        repo = OutboxRepository(pool)
        # A first, healthy batch: the journal connection is up, so the next batch's journal
        # row is written concurrently with its publish (the latency path), not before it.
        await pool.check()
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO outbox (id, stream, created_at) VALUES"
                " ('warm-' || gen_random_uuid(), 'workflow.tasks.warm.0', now() - interval '1h')"
            )
        async with repo.claims.claim_batch(1, hold_for=30) as warm:
            await warm.settle([r.id for r in warm.rows])
        async with repo.claims.claim_batch(50, hold_for=30, probe=sys.argv[2] == "probe") as batch:
            print(len(batch.rows), batch.journal is not None, flush=True)
            os._exit(3)  # dies holding the rows, as if the row had killed it

    asyncio.run(main())
    """
)


async def test_a_row_that_keeps_killing_its_enqueuer_ends_in_the_dlq(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    """A first crash only makes it a suspect; each crash while it is probed alone counts."""
    (row_id,) = insert_rows(outbox_db_url, 1, queue=queue, max_retries=2)
    repo = OutboxRepository(pool)
    expected = [
        ("batch", Recovery(suspects=1)),
        ("probe", Recovery(retried=1)),
        ("probe", Recovery(retried=1)),
        ("probe", Recovery(dead=1)),
    ]
    for claim, recovery in expected:
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", CRASH_WHILE_HOLDING, outbox_db_url, claim],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # A batch's journal row is written beside its publish; a probe's, before it.
        concurrent = "True" if claim == "batch" else "False"
        assert (out.returncode, out.stdout.strip()) == (3, f"1 {concurrent}"), out.stderr
        for _ in range(100):  # the server notices the dead client and aborts the transaction
            found = await repo.recover_batches()
            if found != Recovery():
                break
            await asyncio.sleep(0.05)
        assert found == recovery
        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            conn.execute("UPDATE outbox SET next_attempt_at = now()")  # due again now
    assert attempts(outbox_db_url) == {row_id: ("DLQ", 3)}
    with psycopg.connect(outbox_db_url) as conn:
        dlq = conn.execute("SELECT id, attempts, last_error FROM outbox_dlq").fetchall()
    assert [(r[0], r[1]) for r in dlq] == [(row_id, 3)]
    assert "did not settle" in dlq[0][2]


async def test_a_session_that_lost_the_prepared_claims_claims_after_preparing_again(
    outbox_db_url: str, queue: str
) -> None:
    insert_rows(outbox_db_url, 10, queue=queue)
    async with one_session(outbox_db_url) as one:
        repo = OutboxRepository(one)
        async with repo.claims.claim_batch(4, hold_for=30) as first:
            await first.settle(first.ids)
        async with one.connection() as conn:  # the same session: its statements go
            await conn.execute("DEALLOCATE ALL")
        async with repo.claims.claim_batch(4, hold_for=30) as second:
            assert len(second) == 4
            await second.settle(second.ids)
        async with repo.claims.claim_batch(4, hold_for=30, probe=True) as probe:
            assert len(probe) == 0  # no suspects; the probe's statement is there too
    assert outbox_status(outbox_db_url) == {"PENDING": 2}


async def test_two_repositories_on_one_pool_share_its_prepared_claims(
    outbox_db_url: str, queue: str
) -> None:
    insert_rows(outbox_db_url, 6, queue=queue)
    async with one_session(outbox_db_url) as one:
        for repo in (OutboxRepository(one), OutboxRepository(one)):
            async with repo.claims.claim_batch(3, hold_for=30) as batch:
                assert len(batch) == 3
                await batch.settle(batch.ids)
    assert outbox_status(outbox_db_url) == {}


async def test_a_batch_settled_with_the_next_claim_is_one_round_trip_on_one_connection(
    outbox_db_url: str, queue: str
) -> None:
    """claim_next: the settlement commits, the next batch is claimed and journalled."""
    ids = insert_rows(outbox_db_url, 10, queue=queue)
    async with one_session(outbox_db_url) as one:
        repo = OutboxRepository(one)
        seen: list[str] = []
        async with repo.claims.claim_batch(4, hold_for=30) as first:
            batch = first
            while True:
                seen += batch.ids
                following = await repo.claims.claim_next(batch, 4, hold_for=30)
                assert batch.settled
                assert following is not None
                if not len(following):
                    break
                assert (await _open_batch_rows(outbox_db_url)) == len(following), (
                    "the next batch is journalled while it is out"
                )
                assert not set(following.ids) & set(seen)
                batch = following
        assert one.get_stats().get("requests_num") == 1, "every batch on one checkout"
    assert sorted(seen) == sorted(ids)
    assert outbox_status(outbox_db_url) == {}
    assert journal(outbox_db_url) == 0


async def test_a_chained_claim_the_session_cannot_run_leaves_the_batch_before_it_settled(
    outbox_db_url: str, queue: str
) -> None:
    insert_rows(outbox_db_url, 10, queue=queue)
    async with one_session(outbox_db_url) as one:
        repo = OutboxRepository(one)
        async with repo.claims.claim_batch(4, hold_for=30) as first:
            await first.conn.execute("DEALLOCATE ALL")  # the claim's EXECUTE comes after COMMIT
            assert await repo.claims.claim_next(first, 4, hold_for=30) is None
            assert first.settled
        assert outbox_status(outbox_db_url) == {"PENDING": 6}
        assert journal(outbox_db_url) == 0
        async with repo.claims.claim_batch(4, hold_for=30) as again:  # prepared again
            assert len(again) == 4
            await again.settle(again.ids)
    assert outbox_status(outbox_db_url) == {"PENDING": 2}


async def test_a_chained_claim_left_unsettled_rolls_back_and_is_recovered(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    """The last batch of a chain is the open one: leaving the block rolls it back."""
    insert_rows(outbox_db_url, 10, queue=queue)
    repo = OutboxRepository(pool)
    async with repo.claims.claim_batch(4, hold_for=30) as first:
        second = await repo.claims.claim_next(first, 4, hold_for=30)
        assert second is not None
        assert len(second) == 4
        assert (await repo.status_counts()).in_flight == 4
    assert outbox_status(outbox_db_url) == {"PENDING": 6}, "the first committed, the second not"
    assert await repo.recover_batches() == Recovery(suspects=4)
    assert {v for v in attempts(outbox_db_url).values()} == {("PENDING", 0)}


async def _open_batch_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox_batches")
        found = row.fetchone()
    return int(found[0]) if found else -1
