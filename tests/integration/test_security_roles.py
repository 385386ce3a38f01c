"""Least-privilege PostgreSQL roles (``dispatcher/outbox/sql/roles.sql``) on a real server.

The suite's own PostgreSQL (roles are cluster-wide: never on the machine's
server). A real ``dispatcher enqueuer`` logs in as ``outbox_enqueuer`` and
drains what a load generator commits as ``outbox_app`` through
``enqueue_dispatch``; each role is denied what it must not do.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from dispatcher import cancel_run, enqueue_dispatch
from tests.data import dispatch
from tests.faults.harness import Pipeline
from tests.faults.load import LoadSpec
from tests.fix_db import as_role

DENIED = psycopg.errors.InsufficientPrivilege


def _denied(conn: psycopg.Connection[object], statement: str) -> bool:
    try:
        conn.execute(statement)
    except DENIED:
        return True
    finally:
        conn.rollback()
    return False


def test_the_app_role_may_only_insert_into_the_outbox_and_cancel_runs(roles_db: str) -> None:
    with psycopg.connect(as_role(roles_db, "outbox_app")) as app:
        outbox_id = enqueue_dispatch(app, dispatch("t1", "secure"))
        assert cancel_run(app, "r-cancelled") == 0  # t1 is of run "r"
        app.commit()
        for statement in (
            *("SELECT * FROM outbox", "SELECT count(*) FROM outbox_dlq"),
            *("SELECT * FROM outbox_cancel", "DELETE FROM outbox_cancel"),
            "INSERT INTO outbox_cancel (run_id) VALUES ('r')",
            *("UPDATE outbox SET status = 'DLQ'", "DELETE FROM outbox", "TRUNCATE outbox"),
            *("DELETE FROM outbox_batches", "CREATE TABLE sneaky (x int)"),
        ):
            assert _denied(app, statement), statement
        assert _settings(app) == ("30s", "5s", "1min")
    with psycopg.connect(roles_db) as owner:
        row = owner.execute("SELECT task_id FROM outbox WHERE id = %s", (outbox_id,)).fetchone()
        cancels = owner.execute("SELECT run_id FROM outbox_cancel").fetchall()
    assert row == ("t1",)
    assert cancels == [("r-cancelled",)]


def test_the_enqueuer_role_is_denied_what_it_does_not_need(roles_db: str) -> None:
    with psycopg.connect(as_role(roles_db, "outbox_enqueuer")) as enq:
        for statement in (
            "INSERT INTO outbox (id, stream) VALUES ('x', 'workflow.tasks.q.0')",
            "TRUNCATE outbox",
            "DROP TABLE outbox_dlq",
            "DELETE FROM outbox_schema_version",
            "CREATE TABLE sneaky (x int)",
            "INSERT INTO outbox_cancel (run_id) VALUES ('r')",
            "SELECT outbox_cancel_run('r')",
        ):
            assert _denied(enq, statement), statement
        assert _settings(enq) == ("30s", "5s", "1min")


def test_a_real_enqueuer_as_outbox_enqueuer_drains_what_outbox_app_commits(
    roles_db: str, redis_url: str, tmp_path: Path
) -> None:
    p = Pipeline(
        scenario="security_roles",
        db_url=roles_db,
        redis_url=redis_url,
        recorder_url=redis_url,
        workdir=tmp_path,
    )
    with psycopg.connect(as_role(roles_db, "outbox_app")) as app:
        cancel_run(app, "r-relayed")  # relayed to Redis by the enqueuer's role
    try:
        enqueuer = p.enqueuer(env={"DATABASE_URL": as_role(roles_db, "outbox_enqueuer")})
        p.worker()
        p.start_load(LoadSpec(tasks=200, rate=100), db_url=as_role(roles_db, "outbox_app"))
        report = p.verify(within=60)
        assert report.committed == 200
        assert enqueuer.alive()
        with psycopg.connect(roles_db) as owner:
            assert owner.execute("SELECT count(*) FROM outbox_cancel").fetchone() == (0,)
    finally:
        p.stop_all()
    log = enqueuer.log.read_text()
    assert "permission denied" not in log, log[-2000:]
    assert "InsufficientPrivilege" not in log, log[-2000:]
    assert "outbox enqueuer stopped" in log


def _settings(conn: psycopg.Connection[object]) -> tuple[str, ...]:
    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    return tuple(str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names)  # type: ignore[index]
