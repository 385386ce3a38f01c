"""The claim of a batch, in one place: its statement, the transaction that holds its rows, its
journal row, and its settlement.

A batch is one transaction on a pooled connection: its row locks are the claim, and its commit
deletes the published rows. ``BatchClaims.claim_batch`` opens it; ``ClaimedBatch.settle``
deletes the published rows, reschedules or dead-letters the rest and commits, in one round trip,
so a batch's outcome is all or nothing. Abandoned (an exception, a cancellation, a crash), it
rolls back and its rows are due again, untouched. ``BatchClaims.claim_next`` settles a batch
that published whole and claims the next in the same round trip.

The statement. The claims (``queries.sql``: ``prepare_claim_batch``, ``prepare_claim_probe``) are
PREPAREd once per session, which also gets the enqueuer's ``hold_for`` as its
``idle_in_transaction_session_timeout``: a paused or hung enqueuer loses its session, and so its
rows. A batch then starts with one simple query of constant text, made once from the batch size
(``ClaimStatement``): BEGIN and EXECUTE. Its rows are the last result: ``ClaimedRow``'s fields,
then the transaction's id. No parameter is bound per batch (the batch size is the enqueuer's own
integer), so nothing is parsed or adapted on the way to the wire. Not a pipeline: the Flush
psycopg sends after a pipeline's Sync disarms the server's idle-in-transaction timer, which is
the whole point of ``hold_for``.

The journal. A batch with rows is journalled (``open_journal``: its token, transaction id and
row ids) on a session of the claims' own, outside the pool (taking a second pooled connection
could deadlock: every batch holding one, waiting for another), while the batch publishes;
``settle`` waits for that row, and its commit deletes it. A batch that never settles leaves its
row for recovery (``OutboxRepository.recover_batches``), which charges the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.outcomes import ClaimedRow, Retry
from dispatcher.outbox.queries import QUERIES

__all__ = ["PREPARE", "SETTLE_ALL", "BatchClaims", "ClaimStatement", "ClaimedBatch", "Rows"]

log = logging.getLogger(__name__)

Rows = list[tuple[Any, ...]]

# The claims' PREPARE statements, run once per session.
PREPARE = (QUERIES["prepare_claim_batch"], QUERIES["prepare_claim_probe"])

_COLUMNS = {f.name: i for i, f in enumerate(dataclasses.fields(ClaimedRow))}
# The settlement of a batch that published whole, ending with its COMMIT (one simple query).
SETTLE_ALL = "; ".join(
    [
        QUERIES["delete_claimed"].rstrip(";"),
        QUERIES["close_journal"].rstrip(";"),
        "COMMIT",
    ]
)
_SETTLE_SENT = "; ".join(
    [
        QUERIES["close_journal"].rstrip(";"),
        QUERIES["delete_published"].rstrip(";"),
        "COMMIT",
    ]
)


class ClaimStatement:
    """The text that BEGINs and claims up to ``limit`` rows (or one suspect).

    ``hold_for`` seconds is the longest the transaction may then sit idle between statements.
    """

    def __init__(self, *, limit: int, hold_for: float) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a claim's limit must be a positive integer, not {limit!r}")
        self.limit = limit
        self.hold_ms = max(1, round(hold_for * 1000))
        self.batch = f"BEGIN; EXECUTE outbox_claim_batch ({limit:d})"
        # For a session set up with another hold_for: this transaction gets this one's.
        self.batch_held = (
            f"BEGIN; SET LOCAL idle_in_transaction_session_timeout = {self.hold_ms:d}; "
            f"EXECUTE outbox_claim_batch ({limit:d})"
        )
        self.probe = "BEGIN; EXECUTE outbox_claim_probe"


class ClaimedBatch:
    """Due rows locked by an open transaction: the claim of one batch.

    Made by ``BatchClaims``. ``settle`` deletes, reschedules and dead-letters in that
    transaction and commits it, in one round trip.

    The claim's rows are kept as they came (in ``ClaimedRow``'s field order); ``column`` reads
    one field of every row for the publishing path, and ``rows`` makes a ``ClaimedRow`` of each
    only when asked (the rows of a batch that went out whole never are).
    """

    def __init__(self, conn: AsyncConnection[Any], token: uuid.UUID, raw: Rows):
        self._conn = conn
        self.token = token
        self._raw = raw
        self._rows: list[ClaimedRow] | None = None
        self.ids: list[str] = [r[0] for r in raw]
        self.settled = False
        self.targets: list[str] | None = None  # the stream each row was published to
        self.journal: asyncio.Task[None] | None = None  # the journal row being written
        # The batch claimed in this one's settlement (``BatchClaims.claim_next``).
        self.next: ClaimedBatch | None = None

    @property
    def conn(self) -> AsyncConnection[Any]:
        """The connection whose open transaction holds the batch's row locks."""
        return self._conn

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def rows(self) -> list[ClaimedRow]:
        if self._rows is None:
            # The claim's last column (the transaction id) is the journal's, not the row's.
            self._rows = [ClaimedRow(*r[: len(_COLUMNS)]) for r in self._raw]
        return self._rows

    def column(self, name: str) -> list[Any]:
        """One of ``ClaimedRow``'s fields for every row, in the claim's order."""
        index = _COLUMNS[name]
        return [r[index] for r in self._raw]

    async def settle(
        self, sent: Sequence[str], retries: Sequence[Retry] = (), dead: Sequence[Retry] = ()
    ) -> None:
        if self.journal is not None:
            await self.journal  # its row must exist before the commit that deletes it
        if not retries and not dead:  # the common case: one statement and COMMIT, one execute
            cur = AsyncClientCursor(self._conn)
            if len(sent) == len(self) and self._raw:
                await cur.execute(SETTLE_ALL, {"token": self.token})
            else:
                await cur.execute(_SETTLE_SENT, {"token": self.token, "ids": list(sent)})
            self.settled = True
            return
        async with self._conn.pipeline():
            await self._conn.execute(QUERIES["close_journal"], {"token": self.token})
            if sent:
                await self._conn.execute(QUERIES["delete_published"], {"ids": list(sent)})
            if retries:
                await self._conn.execute(QUERIES["schedule_retries"], _retry_params(retries))
            if dead:
                params = _retry_params(dead)
                del params["delays"]
                await self._conn.execute(QUERIES["move_to_dlq"], params)
            await self._conn.execute("COMMIT")
        self.settled = True


def _retry_params(retries: Sequence[Retry]) -> dict[str, Any]:
    return {
        "ids": [r.id for r in retries],
        "attempts": [r.attempt for r in retries],
        "delays": [r.delay for r in retries],
        "errors": [r.error for r in retries],
    }


class BatchClaims:
    """Claims batches on ``pool``'s sessions; journals them on a session of its own.

    ``journal_session``: the conninfo and connection settings of that session (the pool's).
    """

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, journal_session: tuple[str, dict[str, Any]]
    ) -> None:
        self._pool = pool
        self._journal_settings = journal_session
        self._holder = f"{socket.gethostname()}-{os.getpid()}"  # journal rows name their process
        self._session: AsyncConnection[Any] | None = None
        self._session_lock = asyncio.Lock()
        self._statements: dict[tuple[int, float], ClaimStatement] = {}
        # The pool's sessions that have the claims prepared, and the idle timeout (ms) each was
        # given (whichever statement prepared them).
        self._prepared: weakref.WeakKeyDictionary[AsyncConnection[Any], int] = (
            weakref.WeakKeyDictionary()
        )

    async def aclose(self) -> None:
        """Close the journal's session (the pool is the caller's)."""
        async with self._session_lock:
            if self._session is not None:
                await self._session.close()
                self._session = None

    @contextlib.asynccontextmanager
    async def claim_batch(
        self, limit: int, *, hold_for: float, probe: bool = False
    ) -> AsyncIterator[ClaimedBatch]:
        """Claim up to ``limit`` due rows (lock them) for the body of the ``async with``.

        With ``probe``, claim one due suspect alone (``limit`` is ignored) and journal the batch
        as a probe: if it never settles, its row alone is charged the attempt. ``hold_for``
        seconds is the longest the transaction may sit idle between statements. Leaving the
        block without ``settle`` rolls the transaction back.
        """
        statement = self._statement(limit, hold_for)
        async with self._pool.connection() as conn:
            rows = await self._begin(conn, statement, probe=probe)
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

        The settlement's statements, its COMMIT, then the next claim's BEGIN and claim go as one
        simple query on the batch's connection: one execute and one wake-up of its backend for
        two batches' work. The next batch (on the same connection, within the same
        ``claim_batch`` block, journalled as any) is returned, or None if the claim could not
        run (the session lost its prepared claim: ``batch`` is settled all the same, as EXECUTE
        comes after its COMMIT). Any other error leaves ``batch`` unsettled as ``settle`` does,
        though its COMMIT may have gone through before the claim failed: either way the
        database is consistent (rows and journal row go together).
        """
        if batch.journal is not None:
            await batch.journal  # its row must exist before the commit that deletes it
        conn = batch.conn
        statement = self._statement(limit, hold_for)
        # A session set up for another hold_for: this transaction gets this one's.
        then = statement.batch if self._prepared.get(conn) == statement.hold_ms else None
        text = f"{SETTLE_ALL}; {then or statement.batch_held}"
        try:
            rows = await _last_rows(AsyncClientCursor(conn), text, {"token": batch.token})
        except psycopg.errors.InvalidSqlStatementName:
            await conn.rollback()
            self._prepared.pop(conn, None)  # prepared again by the next claim_batch
            rows = None
        batch.settled = True
        if rows is None:
            return None
        try:
            batch.next = await self._claimed(conn, rows, probe=False)
        except Exception as exc:  # not journalled, so never handed out: rolled back by claim_batch
            log.warning("could not claim after settling a batch (claimed again later): %s", exc)
            return None
        return batch.next

    def _statement(self, limit: int, hold_for: float) -> ClaimStatement:
        """The statement of these settings, made once (an enqueuer has one or two)."""
        statement = self._statements.get((limit, hold_for))
        if statement is None:
            statement = self._statements[limit, hold_for] = ClaimStatement(
                limit=limit, hold_for=hold_for
            )
        return statement

    async def _begin(
        self, conn: AsyncConnection[Any], statement: ClaimStatement, *, probe: bool
    ) -> Rows:
        """Open the batch's transaction on ``conn`` and claim; the rows locked."""
        text = statement.probe if probe else statement.batch
        await self._prepare(conn, statement)
        try:
            return await _last_rows(conn.cursor(), text)
        except psycopg.errors.InvalidSqlStatementName:
            # The session lost them (a DEALLOCATE ALL, which psycopg sends after some
            # rollbacks): nothing was claimed; prepare them again and claim.
            await conn.rollback()
            self._prepared.pop(conn, None)
            await self._prepare(conn, statement)
            return await _last_rows(conn.cursor(), text)

    async def _prepare(self, conn: AsyncConnection[Any], statement: ClaimStatement) -> None:
        """The claims prepared on this session, and its idle timeout this statement's."""
        held = self._prepared.get(conn)
        if held is None:
            for prepare in PREPARE:
                # Already there: prepared by another enqueuer's claims on the same pool.
                with contextlib.suppress(psycopg.errors.DuplicatePreparedStatement):
                    await conn.execute(prepare)
        if held != statement.hold_ms:  # autocommitted: it stays, for every batch of the session
            await conn.execute(f"SET idle_in_transaction_session_timeout = {statement.hold_ms:d}")
        self._prepared[conn] = statement.hold_ms

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
                batch.journal = asyncio.create_task(self._journal(params))
                await asyncio.sleep(0)
            else:  # it would queue: written before the rows are handed out
                await self._journal(params)
        return batch

    async def _journal(self, params: dict[str, Any]) -> None:
        """The batch's journal row, on the claims' own session."""
        async with self._session_lock:
            if self._session is None or self._session.closed:
                conninfo, kwargs = self._journal_settings
                self._session = await AsyncConnection.connect(conninfo, **kwargs)
            try:
                # Prepared: the journal's INSERT runs while the batch publishes, on the same
                # cores as Redis; parsing and planning it once per session leaves them more.
                await self._session.execute(QUERIES["open_journal"], params, prepare=True)
            except psycopg.OperationalError:
                await self._session.close()  # reconnect next time
                raise


async def _last_rows(cur: AsyncCursor[Any], text: str, params: Any = None) -> Rows:
    """Run ``text`` and return the rows of its last statement (the claim)."""
    await cur.execute(text, params)
    await cur.set_result(-1)
    return await cur.fetchall()
