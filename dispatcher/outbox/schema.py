"""Versioned migrations of the outbox schema, applied by ``dispatcher migrate``.

Each ``sql/migrations/NNNN_name.sql`` runs once, in order, in one transaction
with the version recorded in ``outbox_schema_version``. A transaction-level
advisory lock serialises concurrent runs (several pods starting at once): the
second waits, then finds nothing left to do.

A migration that locks ``outbox`` bounds its wait with ``SET LOCAL lock_timeout``
(application INSERTs queue behind its lock request meanwhile). When a long
transaction outlasts it, the whole run rolls back and is tried again a few
times, with a growing pause, each retry logged; the last failure is raised.

``require_schema`` is what a process checks at start: the schema present and at
least at the version this code expects (newer is a rolling upgrade: a warning).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

__all__ = [
    "MIGRATE_LOCK_KEY",
    "Migration",
    "OutboxMissing",
    "SchemaNotReady",
    "applied_versions",
    "available_migrations",
    "migrate",
    "require_schema",
]

log = logging.getLogger(__name__)

# Arbitrary constant shared by every version of this package: "outbox" in ASCII.
MIGRATE_LOCK_KEY = 0x6F7574626F78

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS outbox_schema_version (
    version    INT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


_LONGEST_PAUSE = 30.0  # seconds between two runs, at most

_RUN_MIGRATE = "run `dispatcher migrate` first"


class SchemaNotReady(Exception):
    """The database lacks the outbox schema, or holds an older one: the message names the fix."""


class OutboxMissing(psycopg.errors.UndefinedTable):
    """``enqueue_dispatch`` found no outbox table; the ``UndefinedTable`` is the cause."""

    def __init__(self) -> None:
        super().__init__(f"the outbox table is missing in this database: {_RUN_MIGRATE}")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    folder = resources.files(__package__).joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, name = entry.name.removesuffix(".sql").partition("_")
            found.append(Migration(int(number), name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def applied_versions(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    cur = await conn.execute("SELECT to_regclass('outbox_schema_version') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return []
    cur = await conn.execute("SELECT version FROM outbox_schema_version ORDER BY version")
    return [int(r[0]) for r in await cur.fetchall()]


async def require_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise ``SchemaNotReady`` unless every migration of this code is applied.

    A schema newer than the code (the next version's migrations already applied
    while this one still runs) is logged once as a warning and accepted.
    """
    applied = set(await applied_versions(conn))
    expected = max(m.version for m in available_migrations())
    if not applied:
        raise SchemaNotReady(f"the outbox schema is missing in this database: {_RUN_MIGRATE}")
    missing = {m.version for m in available_migrations()} - applied
    if missing:
        raise SchemaNotReady(
            f"the outbox schema is at version {max(applied - missing, default=0)}, "
            f"this code needs {expected}: {_RUN_MIGRATE}"
        )
    if max(applied) > expected:
        log.warning(
            "the outbox schema is at version %d, newer than this code's %d: "
            "running on (a rolling upgrade); upgrade this process",
            max(applied),
            expected,
        )


async def migrate(
    conn: psycopg.AsyncConnection[Any], *, attempts: int = 5, backoff: float = 1.0
) -> list[Migration]:
    """Apply the missing migrations; return those applied (empty when up to date).

    A run that gives up waiting for a lock (``lock_timeout``) is retried up to
    ``attempts`` runs in all, after ``backoff`` seconds, doubling each time.
    """
    attempt = 1
    while True:
        running: list[Migration] = []
        try:
            return await _apply_missing(conn, running)
        except psycopg.errors.LockNotAvailable as exc:
            if attempt >= attempts:
                raise
            delay = min(backoff * 2 ** (attempt - 1), _LONGEST_PAUSE)
            name = f"{running[-1].version:04d}_{running[-1].name}" if running else "migrate"
            log.warning(
                "migration %s gave up waiting for a lock (%s): a transaction holds the table; "
                "attempt %d of %d, retrying in %.3g s",
                name,
                str(exc).strip().splitlines()[0],
                attempt,
                attempts,
                delay,
            )
            await asyncio.sleep(delay)
            attempt += 1


async def _apply_missing(
    conn: psycopg.AsyncConnection[Any], running: list[Migration]
) -> list[Migration]:
    """One run, in one transaction; ``running`` gets each migration as it starts."""
    applied: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        await conn.execute(_VERSION_TABLE)
        done = set(await applied_versions(conn))
        for migration in available_migrations():
            if migration.version in done:
                continue
            log.info("applying migration %04d_%s", migration.version, migration.name)
            running.append(migration)
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO outbox_schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied
