"""Versioned migrations of the outbox schema, applied by ``dispatcher migrate``.

Each ``sql/migrations/NNNN_name.sql`` runs once, in order, in one transaction
with the version recorded in ``outbox_schema_version``. A transaction-level
advisory lock serialises concurrent runs (several pods starting at once): the
second waits, then finds nothing left to do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

__all__ = ["MIGRATE_LOCK_KEY", "Migration", "applied_versions", "available_migrations", "migrate"]

log = logging.getLogger(__name__)

# Arbitrary constant shared by every version of this package: "outbox" in ASCII.
MIGRATE_LOCK_KEY = 0x6F7574626F78

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS outbox_schema_version (
    version    INT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


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


async def migrate(conn: psycopg.AsyncConnection[Any]) -> list[Migration]:
    """Apply the missing migrations; return those applied (empty when up to date)."""
    applied: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        await conn.execute(_VERSION_TABLE)
        done = set(await applied_versions(conn))
        for migration in available_migrations():
            if migration.version in done:
                continue
            log.info("applying migration %04d_%s", migration.version, migration.name)
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO outbox_schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied
