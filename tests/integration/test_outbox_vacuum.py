"""The outbox stays small when autovacuum does not vacuum it.

On the suite's own PostgreSQL (roles are cluster-wide). Autovacuum is turned off
for the outbox alone, as a server with ``autovacuum = off`` (or a starved
autovacuum) would leave it.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.vacuum import OutboxVacuum, VacuumState, needs_vacuum


def churn(url: str, rows: int) -> None:
    """Insert and delete ``rows`` outbox rows, as dispatch does; flush the statistics."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO outbox (id, stream) SELECT 'v' || g, 'workflow.tasks.q'"
            "  FROM generate_series(1, %s) AS g",
            (rows,),
        )
        conn.execute("DELETE FROM outbox")
        conn.execute("SELECT pg_stat_force_next_flush()")


def dead_tuples(url: str) -> tuple[int, Any]:
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables WHERE relname = 'outbox'"
        ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


async def open_pool(url: str) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    return pool


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (VacuumState(20_000, None, True), True),  # never vacuumed
        (VacuumState(20_000, 120.0, True), True),  # nothing for two minutes
        (VacuumState(20_000, 5.0, True), False),  # autovacuum is on it
        (VacuumState(500, None, True), False),  # few dead tuples
    ],
)
def test_vacuum_only_when_autovacuum_is_not_coping(state: VacuumState, expected: bool) -> None:
    assert needs_vacuum(state, threshold=10_000, stale_after=60) is expected
    assert not needs_vacuum(state, threshold=0, stale_after=60), "0 turns it off"


async def test_maintenance_vacuums_an_outbox_nothing_else_vacuums(own_pg_db_url: str) -> None:
    churn(own_pg_db_url, 12_000)
    assert dead_tuples(own_pg_db_url)[0] >= 10_000
    pool = await open_pool(own_pg_db_url)
    try:
        vacuum = OutboxVacuum(pool, threshold=10_000)
        assert await vacuum.run_once()
        dead, last_vacuum = dead_tuples(own_pg_db_url)
        assert dead < 10_000
        assert last_vacuum is not None
        churn(own_pg_db_url, 12_000)
        assert not await vacuum.run_once(), "vacuumed a moment ago: not again yet"
    finally:
        await pool.close()


async def test_a_role_that_cannot_vacuum_says_so_once(
    own_pg_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"od_enq_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_pg_db_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT SELECT ON outbox TO "{role}"')
    churn(own_pg_db_url, 12_000)
    url = psycopg.conninfo.make_conninfo(own_pg_db_url, user=role)
    pool = await open_pool(url)
    try:
        vacuum = OutboxVacuum(pool, threshold=10_000)
        with caplog.at_level(logging.WARNING, logger="dispatcher.outbox.vacuum"):
            assert not await vacuum.run_once()
            assert not await vacuum.run_once()
        (warning,) = caplog.records
        assert "cannot" in warning.getMessage()
        assert "autovacuum" in warning.getMessage()
        assert dead_tuples(own_pg_db_url)[0] >= 10_000
    finally:
        await pool.close()
