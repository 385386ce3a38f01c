"""All database I/O of the enqueuer, through one narrow async interface.

A batch is one transaction on a pooled connection: its row locks are the
claim (``claim_batch`` opens it, ``claim.ClaimedBatch`` settles it), and its
commit deletes the published rows. Every other statement runs autocommitted
as one short transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.backoff import RECOVERY_PARAMS
from dispatcher.outbox.claim import SETTLE_ALL, ClaimedBatch
from dispatcher.outbox.claim_statement import Rows, claim_statement
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
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        self._holder = f"{socket.gethostname()}-{os.getpid()}"  # journal rows name their process
        # The process's own session, outside the pool: it writes journal rows while a batch
        # holds its pooled connection (taking a second one from the pool could deadlock: every
        # batch holding one, waiting for another).
        self._session: AsyncConnection[Any] | None = None
        self._session_lock = asyncio.Lock()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    async def aclose(self) -> None:
        """Close the process's own session (the pool is the caller's)."""
        async with self._session_lock:
            if self._session is not None:
                await self._session.close()
                self._session = None

    def session_settings(self) -> tuple[str, dict[str, Any]]:
        """The pool's conninfo and connection settings, for a session of one's own."""
        conninfo, kwargs = self._pool.conninfo, self._pool.kwargs
        if not isinstance(conninfo, str) or not isinstance(kwargs, dict):
            raise TypeError("the enqueuer's pool needs a plain conninfo and kwargs")
        return conninfo, kwargs

    async def _on_session(self, name: str, params: dict[str, Any]) -> Any:
        async with self._session_lock:
            if self._session is None or self._session.closed:
                conninfo, kwargs = self.session_settings()
                self._session = await AsyncConnection.connect(conninfo, **kwargs)
            try:
                # Prepared: the journal's INSERT runs while the batch publishes, on the same
                # cores as Redis; parsing and planning it once per session leaves them more.
                cur = await self._session.execute(QUERIES[name], params, prepare=True)
                return await cur.fetchone() if cur.description else None
            except psycopg.OperationalError:
                await self._session.close()  # reconnect next time
                raise

    async def _open_journal(self, params: dict[str, Any]) -> None:
        await self._on_session("open_journal", params)

    async def _execute(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(QUERIES[name], params)
            return await cur.fetchall() if cur.description else []

    @contextlib.asynccontextmanager
    async def claim_batch(
        self,
        limit: int,
        *,
        hold_for: float,
        probe: bool = False,
    ) -> AsyncIterator[ClaimedBatch]:
        """Claim up to ``limit`` due rows (lock them) for the body of the ``async with``.

        With ``probe``, claim one due suspect alone (``limit`` is ignored) and
        journal the batch as a probe: if it never settles, its row alone is
        charged the attempt.

        ``hold_for`` seconds is the longest the transaction may sit idle
        between statements (``idle_in_transaction_session_timeout``): a paused
        or hung enqueuer loses its session, and so its rows, after that. A
        batch with rows is journalled while it is out (``settle`` waits for
        the journal row). Leaving the block without ``settle`` rolls the
        transaction back.
        """
        async with self._pool.connection() as conn:
            rows = await claim_statement(limit, hold_for).begin(conn, probe=probe)
            batch = await self._claimed(conn, rows, probe=probe)
            try:
                yield batch
            finally:
                while batch.next is not None:  # batches chained by claim_next: the last is open
                    batch = batch.next
                if not batch.settled and batch.journal is not None:
                    with contextlib.suppress(Exception):  # let it land: recovery counts the attempt
                        await asyncio.shield(batch.journal)
                # Whatever is still open: an unsettled batch, or a chained claim that failed
                # after its predecessor's COMMIT.
                if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                    await conn.rollback()

    async def claim_next(
        self, batch: ClaimedBatch, limit: int, *, hold_for: float
    ) -> ClaimedBatch | None:
        """Settle ``batch`` (published whole) and claim the next one, in one round trip.

        The settlement's statements, its COMMIT, then the next claim's BEGIN and
        claim go as one simple query on the batch's connection: one execute and
        one wake-up of its backend for two batches' work. The next batch (on the
        same connection, within the same ``claim_batch`` block, journalled as any)
        is returned, or None if the claim could not run (the session lost its
        prepared claim: ``batch`` is settled all the same, as EXECUTE comes after
        its COMMIT). Any other error leaves ``batch`` unsettled as ``settle``
        does, though its COMMIT may have gone through before the claim failed:
        either way the database is consistent (rows and journal row go together).
        """
        if batch.journal is not None:
            await batch.journal  # its row must exist before the commit that deletes it
        conn = batch.conn
        statement = claim_statement(limit, hold_for)
        rows = await statement.after(conn, SETTLE_ALL, {"token": batch.token})
        batch.settled = True
        if rows is None:
            return None
        try:
            batch.next = await self._claimed(conn, rows, probe=False)
        except Exception as exc:  # not journalled, so never handed out: rolled back by claim_batch
            log.warning("could not claim after settling a batch (claimed again later): %s", exc)
            return None
        return batch.next

    async def _claimed(
        self, conn: AsyncConnection[Any], rows: Rows, *, probe: bool
    ) -> ClaimedBatch:
        """The batch of the claimed ``rows`` (their last column: the transaction id); journalled."""
        batch = ClaimedBatch(conn, uuid.uuid4(), rows)
        if rows:
            xact = rows[0][-1]
            if xact is None:  # locking a row always assigns one
                raise RuntimeError("a batch locked rows but has no transaction id")
            params = {
                "token": batch.token,
                "xact": xact,
                "ids": batch.ids,
                "enqueuer": self._holder,
                "probe": probe,
            }
            connected = self._session is not None and not self._session.closed
            # A probe's journal row is its suspect's only record of the attempt: always
            # written before the row is handed out (probes are rare; latency does not matter).
            if connected and not self._session_lock.locked() and not probe:
                # Written while the batch publishes: one round trip off the dispatch latency.
                # The yield lets the task (lock free, connection up) put the INSERT on the wire
                # before the caller touches a row, so even a crash a row causes at once is
                # journalled.
                batch.journal = asyncio.create_task(self._open_journal(params))
                await asyncio.sleep(0)
            else:  # it would queue: written before the rows are handed out
                await self._open_journal(params)
        return batch

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
