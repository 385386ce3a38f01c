"""The application's API for cancelling a run: ``cancel_run`` and its async twin.

Like ``enqueue_dispatch``, one statement on the connection or cursor the
application holds, never a commit or a rollback: the cancel exists exactly
when the application's own change does, and a rolled-back transaction
cancels nothing. The statement (``outbox_cancel_run``, migration 0011) records
the run in ``outbox_cancel`` and deletes its rows still waiting in the outbox;
rows a batch is publishing at that moment are left to it. Once committed, an
enqueuer records the cancel in Redis for the workers (``cancel_relay.py``),
who then start no run of the run's attempts (``dispatcher.worker.cancels``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from dispatcher.outbox.app_api import AsyncTarget, SyncTarget
from dispatcher.outbox.queries import QUERIES

__all__ = ["CancelMissing", "InvalidRunId", "cancel_run", "cancel_run_async", "cancel_run_now"]


class InvalidRunId(ValueError):
    """A run id that cannot name a run to cancel; the message says why."""


class CancelMissing(psycopg.errors.UndefinedFunction):
    """The database has no ``outbox_cancel_run`` (migration 0011); the original is the cause."""

    def __init__(self) -> None:
        super().__init__(
            "outbox_cancel_run is missing in this database (the schema is older than "
            "cancel_run): run `dispatcher migrate` first"
        )


def _params(run_id: object) -> dict[str, Any]:
    if not isinstance(run_id, str):
        raise InvalidRunId(f"run_id must be a string, got {type(run_id).__name__}")
    if not run_id:
        raise InvalidRunId("run_id must not be empty (it would name every task without a run)")
    if "\x00" in run_id:
        raise InvalidRunId("run_id must not contain NUL (\\x00) characters")
    return {"run_id": run_id}


def cancel_run(target: SyncTarget, run_id: str) -> int:
    """Cancel the run ``run_id`` in the transaction of ``target``; return the outbox rows removed.

    Raises ``InvalidRunId`` (the transaction untouched) for an empty or
    non-string id, and ``CancelMissing`` when ``dispatcher migrate`` has not
    brought the schema that far (the transaction is then aborted and must be
    rolled back).
    """
    params = _params(run_id)
    try:
        cursor = target.execute(QUERIES["cancel_run"], params)
    except psycopg.errors.UndefinedFunction as exc:
        raise CancelMissing() from exc
    return _removed(cursor.fetchone())


async def cancel_run_async(target: AsyncTarget, run_id: str) -> int:
    """The async twin of ``cancel_run`` for ``AsyncConnection``/``AsyncCursor``."""
    params = _params(run_id)
    try:
        cursor = await target.execute(QUERIES["cancel_run"], params)
    except psycopg.errors.UndefinedFunction as exc:
        raise CancelMissing() from exc
    return _removed(await cursor.fetchone())


async def cancel_run_now(conn: psycopg.AsyncConnection[Any], run_id: str) -> int:
    """Cancel ``run_id`` in a transaction of its own, committed (the CLI's and the console's)."""
    removed = await cancel_run_async(conn, run_id)
    await conn.commit()
    return removed


def _removed(row: Any) -> int:
    """The count of the statement's one row, whatever row factory the caller's cursor has."""
    if row is None:
        return 0
    return int(row["removed"] if isinstance(row, dict) else row[0])
