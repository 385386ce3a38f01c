"""What PostgreSQL would refuse, ``TaskDispatch`` and ``enqueue_dispatch`` refuse first.

A value the server refuses aborts the caller's whole transaction (its business writes with
it). Each is refused here with one clear ``ValueError`` before any SQL: the transaction
goes on, and the next dispatch in it commits with it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from dispatcher.models import TaskDispatch
from dispatcher.outbox import enqueue_dispatch
from tests.data import dispatch
from tests.outbox_rows import outbox_status

INT32_MAX = 2**31 - 1

BAD_FIELDS: dict[str, dict[str, Any]] = {
    "surrogate-in-input": {"input": '"\ud800"'},
    "surrogate-in-node-id": {"node_id": "n\udfff"},
    "surrogate-in-run-id": {"run_id": "r\ud83d"},
}
BAD_OPTIONS: dict[str, dict[str, Any]] = {
    "retries-past-int32": {"max_retries": INT32_MAX + 1},
    "negative-retries": {"max_retries": -1},
    "backoff-past-int32": {"backoff_seconds": 2**40},
    "negative-backoff": {"backoff_seconds": -5},
}


@pytest.mark.parametrize("bad", sorted(BAD_FIELDS))
def test_a_dispatch_postgresql_would_refuse_is_refused_first(bad: str) -> None:
    with pytest.raises(ValueError, match="surrogate"):
        dispatch("t1", "q", **BAD_FIELDS[bad])


@pytest.mark.parametrize("bad", sorted(BAD_OPTIONS))
def test_options_postgresql_would_refuse_are_refused_before_any_sql(
    outbox_db_url: str, bad: str
) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        with pytest.raises(ValueError, match="must be an integer from 0 to 2147483647"):
            enqueue_dispatch(conn, dispatch("t-bad", "q"), **BAD_OPTIONS[bad])
        enqueue_dispatch(conn, dispatch("t-good", "q"))  # the transaction goes on
        conn.commit()
    assert outbox_status(outbox_db_url) == {"PENDING": 1}


def test_the_largest_values_postgresql_takes_are_taken(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        enqueue_dispatch(
            conn, dispatch("t1", "q"), max_retries=INT32_MAX, backoff_seconds=INT32_MAX
        )
        enqueue_dispatch(conn, TaskDispatch.model_validate(dispatch("t2", "q").model_dump()))
    assert outbox_status(outbox_db_url) == {"PENDING": 2}
