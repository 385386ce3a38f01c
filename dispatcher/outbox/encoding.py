"""Rows the enqueuer routes and encodes itself, shared by the claim path and the notified path.

PostgreSQL builds most entries in the claim query; the rows it leaves (a payload
its encoder could write differently, a trace context to continue) and every row
published from a notification are routed and encoded here, by the same
functions, so an entry is byte-identical whichever path publishes it. Whatever
building one row's entry raises fails that row alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from dispatcher.models import payload_fields
from dispatcher.outbox.claim import ClaimedBatch
from dispatcher.outbox.outcomes import ClaimedRow
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.naming import route_stream
from dispatcher.stream.publisher import xadd_command
from dispatcher.tracing import child_span

__all__ = [
    "FALLBACK_STREAM",
    "Entry",
    "encode_left_rows",
    "encode_rows",
    "short_error",
    "target_stream",
]

log = logging.getLogger(__name__)

FALLBACK_STREAM = "workflow.tasks"

Entry = tuple[str, dict[str, str]]


def target_stream(row: ClaimedRow, shards: int) -> str:
    """The stream a claimed row is published to at ``shards``: the one place that decides it.

    A row without a task id (written by hand) still spreads, by its own id.
    """
    return route_stream(row.stream or FALLBACK_STREAM, row.task_id or row.id, shards)


def encode_left_rows(
    batch: ClaimedBatch,
    shards: int,
    spans: contextlib.ExitStack,
    *,
    streams: list[Any],
    commands: list[Any],
) -> dict[int, BaseException]:
    """Route and encode the rows the claim left to the enqueuer, in place; the rows that failed.

    Whatever building a row's entry raises fails that row alone.
    """
    failed: dict[int, BaseException] = {}
    for i, row in enumerate(batch.rows):
        if commands[i] is not None:
            continue
        try:
            stream, fields = _traced(_entry(row, shards), spans)
            streams[i], commands[i] = stream, xadd_command(stream, fields)
        except Exception as exc:
            log.error("outbox row %s cannot be published: %s", row.id, short_error(exc))
            failed[i] = exc
    return failed


def encode_rows(
    rows: Sequence[ClaimedRow], shards: int, spans: contextlib.ExitStack
) -> tuple[list[Entry], list[PublishResult | None]]:
    """Route and encode rows here, as for the rows a claim leaves to the enqueuer.

    The second list has one item per row: None for a row whose entry is in the
    first list (in order), the error for a row that cannot be encoded.
    """
    results: list[PublishResult | None] = []
    entries: list[Entry] = []
    for row in rows:
        try:
            entries.append(_traced(_entry(row, shards), spans))
            results.append(None)
        except Exception as exc:
            log.error("outbox row %s cannot be published: %s", row.id, short_error(exc))
            results.append(PublishResult(stream=row.stream, error=exc))
    return entries, results


def _entry(row: ClaimedRow, shards: int) -> Entry:
    return target_stream(row, shards), payload_fields(row.payload, row.id)


def _traced(entry: Entry, spans: contextlib.ExitStack) -> Entry:
    """An entry that carries a trace gets a publish span; its context replaces the entry's."""
    stream, fields = entry
    if "traceparent" not in fields:
        return entry
    attributes = {"messaging.destination.name": stream}
    own = spans.enter_context(child_span(fields, "outbox publish", kind="PRODUCER", **attributes))
    return stream, {**fields, **own}


def short_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]
