"""Claims cost the same whether or not many rows are waiting for a later time, or are
locked by another claim.

Rows scheduled for later (``not_before``, retries backing off) must not be read
by every claim: the claim's plan touches about as many pages with 50,000 of them
waiting as with none (EXPLAIN ANALYZE, BUFFERS: pages, not time). Rows another
claim holds (concurrent batches: the next claim walks past them) are skipped
before their payloads are read: a claim past 200 held rows with payloads stored
out of line (TOAST) touches about as many pages as past 200 held rows with tiny
payloads, not one more page or so per skipped row.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from dispatcher.outbox.claim import PREPARE
from tests.data import insert_rows

NOT_YET_DUE = """
INSERT INTO outbox (id, task_id, stream, payload, next_attempt_at)
SELECT 'later-' || g, 'later-' || g, 'workflow.tasks.later.0', '{}', now() + interval '1 hour'
  FROM generate_series(1, %(n)s) AS g
"""


def claim_plan(db_url: str, *, prepared: bool, limit: int = 100) -> dict[str, Any]:
    """The claim's plan as planned for its limit (a custom plan: the first five executions of
    the prepared claim), or (``prepared``) its generic plan, which PostgreSQL switches to
    after five executions."""
    with psycopg.connect(db_url) as conn:
        conn.execute("ANALYZE outbox")
        for statement in PREPARE:
            conn.execute(statement)
        mode = "force_generic_plan" if prepared else "force_custom_plan"
        conn.execute(f"SET plan_cache_mode = {mode}")
        explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        row = conn.execute(f"{explain}EXECUTE outbox_claim_batch ({limit:d})").fetchone()
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


# Payloads that stay out of line: ~6 KB of hex digests, which pglz cannot shrink below
# the 2 KB TOAST threshold; each is several TOAST chunks away from its row.
LARGE_PAYLOADS = """
UPDATE outbox
   SET payload = jsonb_build_object(
       'blob', (SELECT string_agg(md5(id || g::text), '') FROM generate_series(1, 190) AS g))
"""
HELD = 200  # rows another transaction holds, which the claim walks past
HOLD_HEAD = f"SELECT id FROM outbox ORDER BY created_at, id LIMIT {HELD} FOR UPDATE"


def pages_past_held_rows(db_url: str, *, large: bool, prepared: bool) -> int:
    """Pages a claim of 10 rows touches while another transaction holds the first 200."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
    insert_rows(db_url, HELD + 20, queue="held", prefix="held-")
    with psycopg.connect(db_url, autocommit=True) as conn:
        if large:
            conn.execute(LARGE_PAYLOADS)
        conn.execute("VACUUM outbox")
    with psycopg.connect(db_url) as holder:
        assert len(holder.execute(HOLD_HEAD).fetchall()) == HELD
        plan = claim_plan(db_url, prepared=prepared, limit=10)
        holder.rollback()
    assert plan["Actual Rows"] == 10
    return pages(plan)


@pytest.mark.parametrize("prepared", [False, True], ids=["query", "prepared"])
def test_claim_does_not_read_the_payloads_of_rows_it_skips(
    outbox_db_url: str, prepared: bool
) -> None:
    tiny = pages_past_held_rows(outbox_db_url, large=False, prepared=prepared)
    large = pages_past_held_rows(outbox_db_url, large=True, prepared=prepared)
    # The 10 claimed payloads cost pages (73 measured); the 200 skipped must cost none: fewer
    # extra pages than rows skipped (322 when the index scan made every payload text).
    assert large - tiny < HELD, (tiny, large)
