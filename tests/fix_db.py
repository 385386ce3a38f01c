"""PostgreSQL fixtures: a fresh, migrated database per test module on the machine's server.

Each module gets its own database (created from ``template0`` and dropped
with FORCE at the end), so modules never see each other's rows, triggers or
listeners. Each test starts with empty outbox tables.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.schema import migrate

ADMIN_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _url_for(database: str) -> str:
    return psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=database)


@pytest.fixture(scope="module")
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database of this test module's own."""
    name = f"od_{request.module.__name__.rsplit('.', 1)[-1][:30]}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield _url_for(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def migrated_url(database_url: str) -> str:
    """The module's database with the outbox schema applied."""
    import asyncio

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await migrate(conn)

    asyncio.run(run())
    return database_url


@pytest.fixture
def db_url(migrated_url: str) -> str:
    """The migrated database, outbox tables emptied for this test."""
    with psycopg.connect(migrated_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox, outbox_dlq, outbox_batches")
    return migrated_url


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    p: AsyncConnectionPool[Any] = AsyncConnectionPool(
        db_url, min_size=1, max_size=10, kwargs={"autocommit": True}, open=False
    )
    await p.open(wait=True)
    yield p
    await p.close()
