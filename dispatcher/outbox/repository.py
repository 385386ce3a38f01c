"""The enqueuer's database: its pool, and what it reads and repairs outside a batch.

The claim of a batch (its statement, transaction, journal row and settlement) is
``dispatcher.outbox.claim``, reached as ``OutboxRepository.claims``. Here: the pool's
sessions, recovery of the journal of batches that never settled, when the next suspect is
due, and the counts by status; each runs autocommitted as one short transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.backoff import RECOVERY_PARAMS
from dispatcher.outbox.claim import BatchClaims
from dispatcher.outbox.queries import QUERIES

__all__ = [
    "STATUSES",
    "OutboxRepository",
    "Recovery",
    "StatusCounts",
    "enqueuer_pool",
]

log = logging.getLogger(__name__)

# The enqueuer's own commits need no synchronous WAL flush: losing the last few in a
# PostgreSQL crash only republishes rows (at-least-once). The application's dispatch
# commit keeps its own synchronous durability. This takes a WAL flush (ms) off every
# claim and delete.
ENQUEUER_SESSION = "-c synchronous_commit=off"


def enqueuer_pool(
    conninfo: str, *, max_size: int, application_name: str = "outbox-dispatcher-enqueuer"
) -> AsyncConnectionPool[Any]:
    """A closed pool of autocommit sessions set up for the enqueuer; ``await pool.open()``."""
    return AsyncConnectionPool(
        conninfo,
        min_size=max_size,  # every batch slot's session open before the first burst
        max_size=max_size,
        kwargs={
            "autocommit": True,
            "application_name": application_name,
            "options": ENQUEUER_SESSION,
        },
        open=False,
    )


# The statuses the enqueuer stores. IN_FLIGHT is not one: rows held by a batch in progress
# stay PENDING or RETRY until it commits (StatusCounts.in_flight counts them).
STATUSES = ("PENDING", "RETRY", "DLQ")


@dataclass(frozen=True, slots=True)
class Recovery:
    """What one recovery pass did with the journal of batches that ended unsettled.

    ``retried``/``dead``: probes (one suspect claimed alone) charged an attempt, rescheduled
    or dead-lettered. ``suspects``: rows of other batches, uncharged, to be probed alone.
    ``foreign``: journal rows from another cluster (a restored dump), discarded unread.
    """

    retried: int = 0
    dead: int = 0
    suspects: int = 0
    foreign: int = 0


@dataclass(frozen=True, slots=True)
class StatusCounts:
    by_status: dict[str, int]
    oldest_age_seconds: dict[str, float]
    dlq: int
    in_flight: int


class OutboxRepository:
    """The enqueuer's pool, the claims on it (``claims``), and its reads and repairs."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        self.claims = BatchClaims(pool, journal_session=self.session_settings())

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    async def aclose(self) -> None:
        """Close the claims' journal session (the pool is the caller's)."""
        await self.claims.aclose()

    def session_settings(self) -> tuple[str, dict[str, Any]]:
        """The pool's conninfo and connection settings, for a session of one's own."""
        conninfo, kwargs = self._pool.conninfo, self._pool.kwargs
        if not isinstance(conninfo, str) or not isinstance(kwargs, dict):
            raise TypeError("the enqueuer's pool needs a plain conninfo and kwargs")
        return conninfo, kwargs

    async def _execute(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(QUERIES[name], params)
            return await cur.fetchall() if cur.description else []

    async def recover_batches(self) -> Recovery:
        """Settle the journal of batches that ended unsettled (see ``Recovery``)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '2s'")
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(QUERIES["discard_foreign_journal"])
            foreign = len(await cur.fetchall())
            await cur.execute(QUERIES["recover_batches"], RECOVERY_PARAMS)
            row = await cur.fetchone()
        assert row is not None
        return Recovery(
            retried=int(row["retried"]),
            dead=int(row["dead"]),
            suspects=int(row["suspects"]),
            foreign=foreign,
        )

    async def suspects_due_in(self) -> float | None:
        """Seconds until the next suspect is due (<= 0: now), or None without suspects."""
        (row,) = await self._execute("suspects_due_in", {})
        due_in = row["due_in"]
        return None if due_in is None else float(due_in)

    async def status_counts(self) -> StatusCounts:
        rows = await self._execute("status_counts", {})
        (dlq,) = await self._execute("dlq_count", {})
        (open_batches,) = await self._execute("open_batches", {})
        return StatusCounts(
            by_status={r["status"]: int(r["rows"]) for r in rows},
            oldest_age_seconds={r["status"]: float(r["oldest_age_seconds"]) for r in rows},
            dlq=int(dlq["count"]),
            in_flight=int(open_batches["rows"]),
        )
