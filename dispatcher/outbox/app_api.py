"""The application's API: ``enqueue_dispatch`` writes a task's dispatch into the outbox.

This is the one part of the library an application calls from its own code
(re-exported as ``from dispatcher import enqueue_dispatch``), hence the name;
the rest of ``dispatcher.outbox`` is the schema and the enqueuer, which reads
what this writes.

One INSERT on the connection or cursor the application already holds; this
never commits or rolls back, so the dispatch exists exactly when the
application's own change does. The sync and async functions share the
statement builder and differ only in how they await.

The row names its queue's stream without a shard: the enqueuer picks the
shard when it publishes, from the count in force then.
"""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dispatcher.models import TaskDispatch
from dispatcher.outbox.backoff import DEFAULT_BACKOFF_SECONDS, DEFAULT_MAX_RETRIES
from dispatcher.outbox.queries import QUERIES
from dispatcher.outbox.schema import OutboxMissing
from dispatcher.stream.naming import queue_stream
from dispatcher.tracing import current_trace_fields

__all__ = ["enqueue_dispatch", "enqueue_dispatch_async"]

TASK_EXECUTION = "TASK_EXECUTION"
_INT32_MAX = 2**31 - 1

SyncTarget = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncTarget = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]


def _statement(
    dispatch: TaskDispatch,
    not_before: datetime | None,
    shards: int | None,
    max_retries: int,
    backoff_seconds: int,
) -> tuple[str, dict[str, Any]]:
    if not_before is not None and not_before.tzinfo is None:
        raise ValueError("not_before must be timezone-aware (e.g. datetime.now(UTC))")
    for name, value in (("max_retries", max_retries), ("backoff_seconds", backoff_seconds)):
        # integer columns: what PostgreSQL refuses would abort the caller's transaction
        if type(value) is not int or not 0 <= value <= _INT32_MAX:
            raise ValueError(f"{name} must be an integer from 0 to {_INT32_MAX}, got {value!r}")
    if shards is not None:
        warnings.warn(
            "enqueue_dispatch(shards=...) is ignored: the enqueuer picks the shard when it "
            "publishes, from composer:stream_shards; drop the argument",
            DeprecationWarning,
            stacklevel=3,
        )
    outbox_id = str(uuid.uuid4())
    params = {
        "id": outbox_id,
        "task_id": dispatch.task_id,
        "stream": queue_stream(dispatch.queue),
        "payload": Jsonb(dispatch.payload(extra=current_trace_fields())),
        "type": TASK_EXECUTION,
        "not_before": not_before,
        "max_retries": max_retries,
        "backoff_seconds": backoff_seconds,
    }
    return QUERIES["insert_dispatch"], params


@contextlib.contextmanager
def _outbox_required() -> Iterator[None]:
    """A missing outbox table raises ``OutboxMissing`` (naming the command), the original its
    cause."""
    try:
        yield
    except psycopg.errors.UndefinedTable as exc:
        raise OutboxMissing() from exc


def enqueue_dispatch(
    target: SyncTarget,
    dispatch: TaskDispatch,
    not_before: datetime | None = None,
    *,
    shards: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS,
) -> str:
    """Insert the dispatch into the outbox on ``target``; return the outbox row id.

    The enqueuer publishes the row no earlier than ``not_before``, to the
    queue's shard under the count in force then. ``shards`` is deprecated and
    ignored (a warning says so).

    Without the outbox table (``dispatcher migrate`` never ran) it raises
    ``OutboxMissing``, an ``UndefinedTable`` naming the command, with the
    original as its cause; the caller's transaction is then aborted, as with
    any failed statement, and must be rolled back.
    """
    query, params = _statement(dispatch, not_before, shards, max_retries, backoff_seconds)
    with _outbox_required():
        target.execute(query, params)
    return str(params["id"])


async def enqueue_dispatch_async(
    target: AsyncTarget,
    dispatch: TaskDispatch,
    not_before: datetime | None = None,
    *,
    shards: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS,
) -> str:
    """The async twin of ``enqueue_dispatch`` for ``AsyncConnection``/``AsyncCursor``.

    Raises ``OutboxMissing`` as it does, the caller's transaction then aborted.
    """
    query, params = _statement(dispatch, not_before, shards, max_retries, backoff_seconds)
    with _outbox_required():
        await target.execute(query, params)
    return str(params["id"])
