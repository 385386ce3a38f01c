"""``migrate``: idempotent, safe when several processes run it at once, versions recorded."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import psycopg

from dispatcher.outbox.schema import available_migrations, migrate


async def test_migrate_twice_is_a_no_op(empty_db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        first = await migrate(conn)
        second = await migrate(conn)
    assert [m.version for m in first] == [m.version for m in available_migrations()]
    assert second == []


async def test_concurrent_migrations_apply_each_version_once(empty_db_url: str) -> None:
    async def one() -> int:
        async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
            return len(await migrate(conn))

    # The first test may have migrated this module's database already; start clean.
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS outbox, outbox_dlq, outbox_schema_version")

    applied = await asyncio.gather(*(one() for _ in range(6)))

    assert sorted(applied) == [0] * 5 + [len(available_migrations())]
    async with await psycopg.AsyncConnection.connect(empty_db_url) as conn:
        rows = await (await conn.execute("SELECT version FROM outbox_schema_version")).fetchall()
    assert [r[0] for r in rows] == [m.version for m in available_migrations()]


def test_schema_has_the_contract_objects(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        trigger = conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'outbox_notify'"
        ).fetchone()
        options = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'outbox'"
        ).fetchone()
        fn = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'composer_notify_outbox'"
        ).fetchone()
    assert trigger is not None
    # One per statement, only while an enqueuer holds the idle flag, carrying nothing.
    assert "TRIGGER outbox_notify AFTER INSERT ON public.outbox FOR EACH STATEMENT" in trigger[1]
    assert "WHEN ((NOT pg_try_advisory_xact_lock_shared(" in trigger[1]
    assert fn is not None
    assert "pg_notify('outbox_new', '')" in fn[0]
    assert options is not None
    assert "autovacuum_vacuum_scale_factor=0.0" in options[0]


def test_cli_migrate_reports_what_it_did(empty_db_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "migrate", "--database-url", empty_db_url],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("migrate: ")
    said = (out.stdout + out.stderr).splitlines()
    for migration in available_migrations():
        name = f"{migration.version:04d}_{migration.name}"
        assert len([line for line in said if name in line]) == 1, said  # each named once
    again = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "migrate", "--database-url", empty_db_url],
        capture_output=True,
        text=True,
        check=True,
    )
    assert again.stdout == "migrate: nothing to do\n"
