"""Every migration that takes a lock on ``outbox`` (DDL, an index dropped, rows updated or
deleted) bounds its wait with ``lock_timeout``.

A DDL statement on a live ``outbox`` waits for the open transactions that wrote to it, and
every application INSERT queues behind that wait: unbounded, one long transaction stalls
every writer for as long as it lasts (CONTRIBUTING: "Add a migration").
"""

from __future__ import annotations

import re

import pytest

from dispatcher.outbox.schema import Migration, available_migrations

# Statements that lock the outbox table itself (not outbox_dlq, outbox_batches: \b).
OUTBOX_DDL = re.compile(
    r"ALTER\s+TABLE\s+(IF\s+EXISTS\s+)?(ONLY\s+)?outbox\b"
    r"|CREATE\s+(UNIQUE\s+)?INDEX\b[^;]*?\sON\s+(ONLY\s+)?outbox\b"
    r"|(CREATE|DROP)\s+(OR\s+REPLACE\s+)?(CONSTRAINT\s+)?TRIGGER\b[^;]*?\sON\s+outbox\b"
    r"|LOCK\s+(TABLE\s+)?outbox\b"
    r"|DROP\s+INDEX\b[^;]*?\sidx_outbox_"
    r"|(UPDATE|DELETE\s+FROM)\s+outbox\b",
    re.IGNORECASE,
)
LOCK_TIMEOUT = re.compile(r"SET\s+LOCAL\s+lock_timeout\s*=", re.IGNORECASE)


def _code(sql: str) -> str:
    """The SQL without its ``--`` comments (a header may name statements it does not run)
    and without function bodies (``AS $$...$$``: they run when called, not when migrating)."""
    return re.sub(r"\bAS\s+\$\$.*?\$\$", "", re.sub(r"--[^\n]*", "", sql), flags=re.DOTALL)


def test_the_pattern_finds_outbox_ddl_and_only_that() -> None:
    for found in (
        "ALTER TABLE outbox ADD COLUMN x int",
        "CREATE INDEX IF NOT EXISTS i ON outbox (a)",
        "DROP TRIGGER IF EXISTS t ON outbox",
        "CREATE CONSTRAINT TRIGGER t AFTER INSERT ON outbox",
        "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE",
        "DROP INDEX IF EXISTS idx_outbox_status",
        "UPDATE outbox SET status = 'RETRY'",
        "DELETE FROM outbox WHERE status = 'SENT'",
    ):
        assert OUTBOX_DDL.search(found), found
    for other in (
        "ALTER TABLE outbox_batches ADD x int",
        "CREATE INDEX i ON outbox_dlq (a)",
        "DELETE FROM outbox_cancel",
        "DROP INDEX IF EXISTS idx_dlq_moved",
    ):
        assert not OUTBOX_DDL.search(other), other


@pytest.mark.parametrize(
    "migration", available_migrations(), ids=lambda m: f"{m.version:04d}_{m.name}"
)
def test_a_migration_that_locks_outbox_sets_lock_timeout_first(migration: Migration) -> None:
    code = _code(migration.sql)
    ddl = OUTBOX_DDL.search(code)
    if ddl is None:
        return
    bound = LOCK_TIMEOUT.search(code)
    assert bound is not None, f"{ddl.group(0)!r} waits unbounded: SET LOCAL lock_timeout first"
    assert bound.start() < ddl.start(), f"lock_timeout is set after {ddl.group(0)!r}"
