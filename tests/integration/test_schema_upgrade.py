"""Upgrading a live outbox: rows written under an older schema survive the migrations after it.

The database is migrated through 0006 (the last schema with the claim columns and the
``IN_FLIGHT``/``SENT`` statuses), filled with a row of every status, then migrated to the end.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from dispatcher.outbox import schema
from dispatcher.outbox.queries import QUERIES
from dispatcher.outbox.schema import available_migrations
from tests.fix_db import migrate_url

DEAD_COLUMNS = {"claim_token", "claimed_at", "sent_at"}

# One row per status 0006 allowed; RETRY is scheduled for later, the rest are due.
ROWS = """
INSERT INTO outbox (id, task_id, stream, payload, status, attempt_count, next_attempt_at,
                    claim_token, claimed_at, sent_at)
VALUES ('pending', 't1', 'workflow.tasks.q', '{"a": 1}', 'PENDING', 0, NULL, NULL, NULL, NULL),
       ('retry', 't2', 'workflow.tasks.q', '{"a": 2}', 'RETRY', 2, now() + interval '1 hour',
        NULL, NULL, NULL),
       ('in_flight', 't3', 'workflow.tasks.q', '{"a": 3}', 'IN_FLIGHT', 1, NULL,
        gen_random_uuid(), now(), NULL),
       ('sent', 't4', 'workflow.tasks.q', '{"a": 4}', 'SENT', 0, NULL, NULL, now(), now()),
       ('dlq', 't5', 'workflow.tasks.q', '{"a": 5}', 'DLQ', 6, NULL, NULL, NULL, NULL);
INSERT INTO outbox_dlq (id, task_id, stream, payload, attempts, last_error)
VALUES ('dlq', 't5', 'workflow.tasks.q', '{"a": 5}', 6, 'boom');
"""


def _columns(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'outbox'"
    ).fetchall()
    return {r[0] for r in rows}


def _rows(conn: psycopg.Connection[Any]) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT id, status, attempt_count, payload, next_attempt_at <= now() FROM outbox"
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.fixture
def at_0006(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database migrated through 0006 only, holding a row of every status of that schema."""
    upto_0006 = [m for m in available_migrations() if m.version <= 6]
    with monkeypatch.context() as patch:
        patch.setattr(schema, "available_migrations", lambda: upto_0006)
        assert migrate_url(empty_db_url) == [1, 2, 3, 4, 5, 6]
    with psycopg.connect(empty_db_url) as conn:
        conn.execute(ROWS)
    return empty_db_url


def test_upgrading_keeps_every_row_that_still_has_to_be_dispatched(at_0006: str) -> None:
    url = at_0006
    applied = migrate_url(url)

    assert 7 in applied
    with psycopg.connect(url) as conn:
        assert not DEAD_COLUMNS & _columns(conn)
        assert _rows(conn) == {
            "pending": ("PENDING", 0, {"a": 1}, None),
            "retry": ("RETRY", 2, {"a": 2}, False),  # still waiting for its time
            # claimed by an enqueuer of the old scheme: due again at once, no attempt charged
            "in_flight": ("RETRY", 1, {"a": 3}, True),
            "dlq": ("DLQ", 6, {"a": 5}, None),
            # "sent" was published already: gone, as the enqueuer deletes what it published
        }
        assert conn.execute("SELECT id, attempts FROM outbox_dlq").fetchall() == [("dlq", 6)]
        conn.execute(QUERIES["prepare_claim_batch"])
        claimed = conn.execute("EXECUTE outbox_claim_batch (10)").fetchall()
        assert {r[0] for r in claimed} == {"pending", "in_flight"}


@pytest.mark.parametrize("status", ["IN_FLIGHT", "SENT"])
def test_the_dead_statuses_can_no_longer_be_written(at_0006: str, status: str) -> None:
    url = at_0006
    migrate_url(url)
    with psycopg.connect(url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE outbox SET status = %s WHERE id = 'pending'", (status,))


def test_0007_run_again_changes_nothing(at_0006: str) -> None:
    url = at_0006
    migrate_url(url)
    (sql,) = [m.sql for m in available_migrations() if m.version == 7]
    with psycopg.connect(url) as conn:
        before = _rows(conn), _columns(conn)
        conn.execute("SET LOCAL lock_timeout = '1234ms'")
        conn.execute(sql.encode())
        assert (_rows(conn), _columns(conn)) == before
        assert conn.execute("SHOW lock_timeout").fetchone() == ("1234ms",), "setting put back"


def test_a_long_transaction_on_the_outbox_fails_the_upgrade_not_the_application(
    at_0006: str,
) -> None:
    url = at_0006
    with psycopg.connect(url) as app:  # a business transaction that wrote a dispatch, still open
        app.execute(
            "INSERT INTO outbox (id, stream, payload) VALUES ('late', 'workflow.tasks.q', '{}')"
        )
        with pytest.raises(psycopg.errors.LockNotAvailable):
            migrate_url(
                url, attempts=1
            )  # the retries: tests/integration/test_migration_lock_wait.py
    assert 7 in migrate_url(url), "the next run applies it"
    with psycopg.connect(url) as conn:
        assert _rows(conn)["late"] == ("PENDING", 0, {}, None)
