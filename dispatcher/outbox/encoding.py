"""Stream entries of claimed outbox rows: routed, and packed as XADD commands.

A claim's rows are read column by column from the batch (no object per row)
and packed as XADD commands ready for one write. Whatever building one row's
entry raises fails that row alone.
"""

from __future__ import annotations

import contextlib
import logging

from dispatcher.models import payload_args, payload_fields
from dispatcher.outbox.claim import ClaimedBatch
from dispatcher.stream.naming import Router
from dispatcher.stream.publisher import xadd_args_command, xadd_command
from dispatcher.tracing import child_span

__all__ = [
    "FALLBACK_STREAM",
    "EncodedBatch",
    "encode_batch",
    "short_error",
]

log = logging.getLogger(__name__)

FALLBACK_STREAM = "workflow.tasks"


class EncodedBatch:
    """A claim's rows as entries: per row, its stream and its packed XADD (empty if it failed).

    ``failed`` maps the index of each row that could not be encoded to its error.
    """

    __slots__ = ("commands", "failed", "streams")

    def __init__(self) -> None:
        self.streams: list[str] = []
        self.commands: list[bytes] = []
        self.failed: dict[int, BaseException] = {}


def encode_batch(batch: ClaimedBatch, shards: int, spans: contextlib.ExitStack) -> EncodedBatch:
    """Route and encode every row of a claim, in its order."""
    out = EncodedBatch()
    route = Router(shards)
    columns = zip(
        batch.ids,
        batch.column("stream"),
        batch.column("payload"),
        batch.column("task_id"),
        strict=True,
    )
    for i, (row_id, stream, payload, task_id) in enumerate(columns):
        try:
            target = route(stream or FALLBACK_STREAM, task_id or row_id)
            if payload is not None and "traceparent" in payload:  # the entry gets a span
                command = xadd_command(
                    target, _traced(target, payload_fields(payload, row_id), spans)
                )
            else:
                command = xadd_args_command(target, payload_args(payload, row_id))
            out.streams.append(target)
            out.commands.append(command)
        except Exception as exc:
            log.error("outbox row %s cannot be published: %s", row_id, short_error(exc))
            out.streams.append(stream)
            out.commands.append(b"")
            out.failed[i] = exc
    return out


def _traced(stream: str, fields: dict[str, str], spans: contextlib.ExitStack) -> dict[str, str]:
    """An entry that carries a trace gets a publish span; its context replaces the entry's."""
    if "traceparent" not in fields:
        return fields
    attributes = {"messaging.destination.name": stream}
    own = spans.enter_context(child_span(fields, "outbox publish", kind="PRODUCER", **attributes))
    return {**fields, **own}


def short_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]
