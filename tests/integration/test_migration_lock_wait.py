"""A migration that meets an open transaction on ``outbox`` gives up its wait and retries.

The application holds an INSERT on the outbox open while ``migrate`` brings a database at
0007 to the end: 0008 waits for that transaction within its ``lock_timeout`` only, so other
application INSERTs, queued behind the migration's lock request, go through; ``migrate``
retries, and completes once the transaction ends.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from dispatcher.outbox import schema
from dispatcher.outbox.schema import available_migrations, migrate
from tests.waiting import eventually

INSERT = "INSERT INTO outbox (id, stream, payload) VALUES (%s, 'workflow.tasks.q', '{}')"
# A hang guard only: a statement blocked this long means nothing bounded the wait.
HANG_GUARD = "-c statement_timeout=120s"


async def test_migration_retries_past_an_open_transaction_and_inserts_go_on(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = empty_db_url
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with monkeypatch.context() as patch:
            upto_0007 = [m for m in available_migrations() if m.version <= 7]
            patch.setattr(schema, "available_migrations", lambda: upto_0007)
            await migrate(conn)

    caplog.set_level(logging.WARNING, logger=schema.__name__)
    app = await psycopg.AsyncConnection.connect(url)  # a business transaction, left open
    await app.execute(INSERT, ("open",))
    mig = await psycopg.AsyncConnection.connect(url, autocommit=True, options=HANG_GUARD)
    migration = asyncio.create_task(migrate(mig, attempts=1000, backoff=0.05))
    try:
        await eventually(
            lambda: any("retrying" in r.getMessage() for r in caplog.records),
            within=60,
            what="the migration gave up a lock wait and retries",
        )
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, options=HANG_GUARD
        ) as other:
            await other.execute(INSERT, ("during",))  # not stuck behind the migration
        assert not migration.done(), "the migration waits for the open transaction"
        await app.commit()
        applied = await asyncio.wait_for(migration, 120)
    finally:
        migration.cancel()
        await app.close()
        await mig.close()
    assert [m.version for m in applied] == [m.version for m in available_migrations()][7:]
    (record, *_) = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert "0008_notify_rows" in record.getMessage()
    async with await psycopg.AsyncConnection.connect(url) as conn:
        ids = await (await conn.execute("SELECT id FROM outbox ORDER BY id")).fetchall()
    assert ids == [("during",), ("open",)]


@pytest.mark.parametrize("start", [2, 3], ids=["from-0002", "from-0003"])
async def test_an_upgrade_from_an_older_schema_bounds_its_first_lock_wait(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch, start: int
) -> None:
    """0003 and 0004 drop an index of the outbox: from a schema before them, that lock wait
    is bounded too (lock_timeout), not left to the statement timeout or for ever."""
    url = empty_db_url
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with monkeypatch.context() as patch:
            older = [m for m in available_migrations() if m.version <= start]
            patch.setattr(schema, "available_migrations", lambda: older)
            await migrate(conn)
    app = await psycopg.AsyncConnection.connect(url)  # a business transaction, left open
    await app.execute(INSERT, ("open",))
    guard = "-c statement_timeout=30s"  # a wait this long means lock_timeout bounded nothing
    try:
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, options=guard
        ) as mig:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await migrate(mig, attempts=1)
        await app.commit()
    finally:
        await app.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as mig:
        applied = await migrate(mig, attempts=1)
    assert applied[0].version == start + 1
