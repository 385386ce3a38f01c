"""PostgreSQL fixtures on the suite's own server: ``empty_db_url``, ``outbox_db_url``, ``pool``,
and ``audited`` (who was charged an attempt); ``roles_db`` on a test's own server.

Each test module gets its own migrated database (created from ``template0``
and dropped with FORCE at the end), so modules never see each other's rows,
triggers or listeners; each test starts with the outbox tables emptied.
A test that wants a database without the schema asks for ``empty_db_url``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.idle_flag import IDLE_FLAG_KEY
from dispatcher.outbox.schema import migrate
from tests.suite_servers import postgres_admin_url

ROLES_SQL = resources.files("dispatcher.outbox").joinpath("sql/roles.sql").read_text()


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (one of roles.sql's, with the database's trust auth)."""
    return psycopg.conninfo.make_conninfo(url, user=role)


@pytest.fixture
def roles_db(own_pg_db_url: str) -> str:
    """A migrated database on the test's own server with ``roles.sql`` applied (twice: it is
    idempotent); roles are cluster-wide, so never on the suite's shared server."""
    with psycopg.connect(own_pg_db_url, autocommit=True) as conn:
        conn.execute(ROLES_SQL)
        conn.execute(ROLES_SQL)  # idempotent
        conn.execute("GRANT INSERT ON fault_business TO outbox_app")  # the app's own table
    return own_pg_db_url


def _create_database(prefix: str) -> str:
    name = f"od_{prefix[:30]}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    return psycopg.conninfo.make_conninfo(postgres_admin_url(), dbname=name)


def _drop_database(url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate_url(url: str, *, attempts: int = 5) -> list[int]:
    """Apply the outbox schema to the database at ``url``; the versions applied."""

    async def run() -> list[int]:
        # A migration that waited for ever would hang the suite: fail it long after lock_timeout.
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, options="-c statement_timeout=120s"
        ) as conn:
            return [m.version for m in await migrate(conn, attempts=attempts)]

    return asyncio.run(run())


@pytest.fixture
def empty_db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A new database with nothing in it, for this test alone."""
    url = _create_database(request.node.name.removeprefix("test_"))
    try:
        yield url
    finally:
        _drop_database(url)


@pytest.fixture(scope="module")
def _module_outbox_db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    url = _create_database(request.module.__name__.rsplit(".", 1)[-1])
    try:
        migrate_url(url)
        yield url
    finally:
        _drop_database(url)


@pytest.fixture
def outbox_db_url(_module_outbox_db_url: str) -> str:
    """This test module's database with the outbox schema, its tables emptied for this test."""
    with psycopg.connect(_module_outbox_db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox, outbox_dlq, outbox_batches, outbox_cancel")
    return _module_outbox_db_url


@pytest.fixture
async def pool(outbox_db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """An autocommit pool on ``outbox_db_url``."""
    p: AsyncConnectionPool[Any] = AsyncConnectionPool(
        outbox_db_url, min_size=1, max_size=10, kwargs={"autocommit": True}, open=False
    )
    await p.open(wait=True)
    yield p
    await p.close()


# Every change of a row's attempt count, so a test can tell who was charged an attempt.
ATTEMPT_AUDIT = """
CREATE TABLE IF NOT EXISTS test_attempts (id TEXT, attempt INT);
TRUNCATE test_attempts;
CREATE OR REPLACE FUNCTION test_audit_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_attempts VALUES (NEW.id, NEW.attempt_count);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS test_audit_attempt ON outbox;
CREATE TRIGGER test_audit_attempt AFTER UPDATE OF attempt_count ON outbox FOR EACH ROW
    WHEN (NEW.attempt_count IS DISTINCT FROM OLD.attempt_count)
    EXECUTE FUNCTION test_audit_attempt();
"""


@pytest.fixture
def audited(outbox_db_url: str) -> Iterator[str]:
    """``outbox_db_url`` noting every change of a row's attempt count (read by ``charged``)."""
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(ATTEMPT_AUDIT)
    yield outbox_db_url
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER IF EXISTS test_audit_attempt ON outbox")


def charged(db_url: str) -> set[str]:
    """The ids whose attempt count changed since ``audited`` set up the audit."""
    with psycopg.connect(db_url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM test_attempts").fetchall()}


def announced(db_url: str) -> list[int]:
    """Backend pids holding the idle flag (exclusive advisory lock IDLE_FLAG_KEY)."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock'"
            " AND granted AND database = (SELECT oid FROM pg_database"
            "                              WHERE datname = current_database())"
            " AND (classid::bigint << 32 | objid::bigint) = %s",
            (IDLE_FLAG_KEY,),
        ).fetchall()
    return [r[0] for r in rows]
