"""The claim as a session runs it: prepared once, then one simple query per batch.

``ClaimStatement`` is the one place that knows the claim's SQL and its results.
The claims (``queries.sql``: ``prepare_claim_batch``, ``prepare_claim_probe``)
are PREPAREd once per session, which also gets the enqueuer's ``hold_for`` as
its ``idle_in_transaction_session_timeout``. A batch then starts with one
simple query of constant text, made once from the batch size: BEGIN and
EXECUTE. Its rows are the last result: ``ClaimedRow``'s fields, then the
transaction's id. No parameter is bound per batch (the batch size is the
enqueuer's own integer), so nothing is parsed or adapted on the way to the wire.

Not a pipeline: the Flush psycopg sends after a pipeline's Sync disarms the
server's idle-in-transaction timer, which is the whole point of ``hold_for``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor

from dispatcher.outbox.queries import QUERIES

__all__ = ["PREPARE", "ClaimStatement", "Rows", "claim_statement"]

Rows = list[tuple[Any, ...]]

# The claims' PREPARE statements, run once per session.
PREPARE = (QUERIES["prepare_claim_batch"], QUERIES["prepare_claim_probe"])

# The sessions of this process that have the claims prepared, and the idle timeout (ms) each
# was given (whichever statement prepared them).
_SESSIONS: weakref.WeakKeyDictionary[AsyncConnection[Any], int] = weakref.WeakKeyDictionary()


class ClaimStatement:
    """BEGIN and claim up to ``limit`` rows (or one suspect) in one round trip.

    ``hold_for`` seconds is the longest the transaction may then sit idle between
    statements: a paused or hung enqueuer loses its session, and so its rows.
    """

    def __init__(self, *, limit: int, hold_for: float) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a claim's limit must be a positive integer, not {limit!r}")
        self.limit = limit
        self.hold_ms = max(1, round(hold_for * 1000))
        self.batch = f"BEGIN; EXECUTE outbox_claim_batch ({limit:d})"
        self._batch_held = (
            f"BEGIN; SET LOCAL idle_in_transaction_session_timeout = {self.hold_ms:d}; "
            f"EXECUTE outbox_claim_batch ({limit:d})"
        )
        self.probe = "BEGIN; EXECUTE outbox_claim_probe"

    async def begin(self, conn: AsyncConnection[Any], *, probe: bool = False) -> Rows:
        """Open the batch's transaction on ``conn`` and claim; the rows locked."""
        text = self.probe if probe else self.batch
        await self._prepare(conn)
        try:
            return await _last_rows(conn.cursor(), text)
        except psycopg.errors.InvalidSqlStatementName:
            # The session lost them (a DEALLOCATE ALL, which psycopg sends after some
            # rollbacks): nothing was claimed; prepare them again and claim.
            await conn.rollback()
            _SESSIONS.pop(conn, None)
            await self._prepare(conn)
            return await _last_rows(conn.cursor(), text)

    async def after(
        self, conn: AsyncConnection[Any], statements: str, params: dict[str, Any]
    ) -> Rows | None:
        """``statements`` (ending with COMMIT), then BEGIN and claim, in one round trip.

        ``params`` are bound into ``statements`` client-side. None if the session had lost
        the prepared claim: ``statements`` ran all the same (EXECUTE comes after them); it
        is prepared again by the next ``begin``.
        """
        # A session set up for another hold_for: this transaction gets this one's.
        then = self.batch if _SESSIONS.get(conn) == self.hold_ms else self._batch_held
        try:
            return await _last_rows(AsyncClientCursor(conn), f"{statements}; {then}", params)
        except psycopg.errors.InvalidSqlStatementName:
            await conn.rollback()
            _SESSIONS.pop(conn, None)
            return None

    async def _prepare(self, conn: AsyncConnection[Any]) -> None:
        """The claims prepared on this session, and its idle timeout this statement's."""
        held = _SESSIONS.get(conn)
        if held is None:
            for statement in PREPARE:
                # Already there: prepared by another repository on the same pool.
                with contextlib.suppress(psycopg.errors.DuplicatePreparedStatement):
                    await conn.execute(statement)
        if held != self.hold_ms:  # autocommitted: it stays, for every batch of the session
            await conn.execute(f"SET idle_in_transaction_session_timeout = {self.hold_ms:d}")
        _SESSIONS[conn] = self.hold_ms


@functools.lru_cache(maxsize=16)
def claim_statement(limit: int, hold_for: float) -> ClaimStatement:
    """The ``ClaimStatement`` of these settings, made once (an enqueuer has one or two)."""
    return ClaimStatement(limit=limit, hold_for=hold_for)


async def _last_rows(cur: AsyncCursor[Any], text: str, params: Any = None) -> Rows:
    """Run ``text`` and return the rows of its last statement (the claim)."""
    await cur.execute(text, params)
    await cur.set_result(-1)
    return await cur.fetchall()
