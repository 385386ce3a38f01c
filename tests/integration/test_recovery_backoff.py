"""Recovery charges an unsettled probe the backoff a failed publish gets.

The backoff is computed in two places that must agree: ``backoff.retry_delay``
(a failed publish, in Python) and ``recover_batches`` (a probe whose batch never
settled, in one set-based statement). Each row's delay must fall in the range
``retry_delay`` draws from (its jitter at 0 and at 1) and reach its upper half, and
a row without its own retry budget or backoff gets the same defaults.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import OutboxRepository
from dispatcher.outbox.backoff import DEFAULT_MAX_RETRIES, retry_delay
from tests.data import insert_rows

PER_CASE = 40
# (backoff_seconds, attempt_count before the probe): 0 is "the default"; the last one is
# past the cap.
CASES = [(3, 0), (3, 2), (0, 1), (600, 4)]


class Jitter(random.Random):
    """A random source whose every draw is ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def _unsettled_probe(url: str, ids: list[str]) -> None:
    """A journal row of a probe whose transaction ended without settling (rolled back)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        conn.rollback()
        assert row is not None
        conn.execute(
            "INSERT INTO outbox_batches (token, xact, ids, enqueuer, probe)"
            " VALUES (%s, %s::xid8, %s, 'test', true)",
            (uuid.uuid4(), row[0], ids),
        )
        conn.commit()


async def test_a_charged_probe_waits_the_backoff_a_failed_publish_gets(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    ids: dict[str, tuple[int, int]] = {}
    for i, (backoff, attempts) in enumerate(CASES):
        for row_id in insert_rows(
            outbox_db_url, PER_CASE, queue=queue, prefix=f"c{i}-", max_retries=99, backoff=backoff
        ):
            ids[row_id] = (backoff, attempts + 1)
        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE outbox SET attempt_count = %s, suspect = true WHERE id LIKE %s",
                (attempts, f"c{i}-%"),
            )
    _unsettled_probe(outbox_db_url, list(ids))
    recovery = await OutboxRepository(pool).recover_batches()
    assert recovery.retried == len(ids)
    with psycopg.connect(outbox_db_url) as conn:
        rows = conn.execute(
            "SELECT id, attempt_count,"
            " extract(epoch FROM next_attempt_at - updated_at)::float8 FROM outbox"
        ).fetchall()
    by_case: dict[tuple[int, int], list[float]] = {}
    for row_id, attempt_count, delay in rows:
        backoff, attempt = ids[row_id]
        assert attempt_count == attempt
        low = retry_delay(backoff, attempt, Jitter(0.0))
        high = retry_delay(backoff, attempt, Jitter(1.0))
        assert low - 1e-3 <= delay <= high + 1e-3, (backoff, attempt, low, delay, high)
        by_case.setdefault((backoff, attempt), []).append(delay)
    for (backoff, attempt), delays in by_case.items():
        low = retry_delay(backoff, attempt, Jitter(0.0))
        high = retry_delay(backoff, attempt, Jitter(1.0))
        assert max(delays) > (low + high) / 2, (backoff, attempt, low, high, max(delays))


async def test_a_row_without_its_own_budget_gets_the_default_one(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    last, over = insert_rows(outbox_db_url, 2, queue=queue, max_retries=0)
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox SET suspect = true, attempt_count = CASE id WHEN %s THEN %s ELSE %s END",
            (last, DEFAULT_MAX_RETRIES - 1, DEFAULT_MAX_RETRIES),
        )
    _unsettled_probe(outbox_db_url, [last, over])
    recovery = await OutboxRepository(pool).recover_batches()
    assert (recovery.retried, recovery.dead) == (1, 1)
    with psycopg.connect(outbox_db_url) as conn:
        status = dict(conn.execute("SELECT id, status FROM outbox").fetchall())
    assert status == {last: "RETRY", over: "DLQ"}
