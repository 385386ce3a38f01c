"""Claims cost the same whether or not many rows are waiting for a later time.

Rows scheduled for later (``not_before``, retries backing off) must not be read
by every claim: the claim's plan touches about as many pages with 50,000 of them
waiting as with none (EXPLAIN ANALYZE, BUFFERS: pages, not time).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from dispatcher._testing.data import insert_rows
from dispatcher.outbox.queries import QUERIES
from dispatcher.outbox.repository import _PREPARE

NOT_YET_DUE = """
INSERT INTO outbox (id, task_id, stream, payload, next_attempt_at)
SELECT 'later-' || g, 'later-' || g, 'workflow.tasks.later.0', '{}', now() + interval '1 hour'
  FROM generate_series(1, %(n)s) AS g
"""


def claim_plan(db_url: str, *, prepared: bool) -> dict[str, Any]:
    """The claim's plan, as a query or (``prepared``) as the enqueuer runs it: the prepared
    statement's generic plan, which PostgreSQL switches to after five executions."""
    with psycopg.connect(db_url) as conn:
        conn.execute("ANALYZE outbox")
        explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        if prepared:
            for statement in _PREPARE:
                conn.execute(statement)
            conn.execute("SET plan_cache_mode = force_generic_plan")
            row = conn.execute(explain + "EXECUTE outbox_claim_batch (100, 0.0)").fetchone()
        else:
            row = conn.execute(
                explain + QUERIES["claim_batch"], {"limit": 100, "min_age": 0.0}
            ).fetchone()
        conn.rollback()
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = doc[0]["Plan"]
    return plan


def pages(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.mark.parametrize("prepared", [False, True], ids=["query", "prepared"])
def test_claim_touches_the_same_pages_with_many_rows_not_yet_due(
    outbox_db_url: str, prepared: bool
) -> None:
    insert_rows(outbox_db_url, 20, queue="due", prefix="due-a-")
    quiet = claim_plan(outbox_db_url, prepared=prepared)
    assert quiet["Actual Rows"] == 20
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
        conn.execute(NOT_YET_DUE, {"n": 50_000})
    insert_rows(outbox_db_url, 20, queue="due", prefix="due-b-")  # created after the waiting ones
    crowded = claim_plan(outbox_db_url, prepared=prepared)
    assert crowded["Actual Rows"] == 20
    assert pages(crowded) <= 2 * pages(quiet) + 10, (pages(quiet), pages(crowded))
