"""Optional OpenTelemetry propagation: one trace from the transaction to the handler.

``enqueue_dispatch`` stores the active context (W3C ``traceparent`` and
``tracestate``) in the payload; the enqueuer opens a publish span as its child
and forwards its own context in the stream entry; the worker runs the handler
inside a span that continues it. Without ``opentelemetry`` installed (the
``otel`` extra) every function here is a cheap no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised only without the extra
    propagate = None
    trace = None

__all__ = [
    "TRACE_FIELDS",
    "carries_trace",
    "child_span",
    "current_trace_fields",
]

TRACE_FIELDS = ("traceparent", "tracestate")


def current_trace_fields() -> dict[str, str]:
    """The active context as W3C fields; empty without OpenTelemetry or an active span."""
    if propagate is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in TRACE_FIELDS}


def carries_trace(fields: Mapping[str, str]) -> bool:
    """Whether ``child_span`` would open a span for ``fields`` (a hot-path check)."""
    return trace is not None and propagate is not None and "traceparent" in fields


@contextlib.contextmanager
def child_span(
    fields: Mapping[str, str], name: str, *, kind: str = "INTERNAL", **attributes: Any
) -> Iterator[dict[str, str]]:
    """A span continuing the trace carried in ``fields``; yields the span's own fields.

    No trace in ``fields`` (or no OpenTelemetry): no span, and ``{}`` is yielded.
    """
    if trace is None or propagate is None or not carries_trace(fields):
        yield {}
        return
    parent = propagate.extract({k: fields[k] for k in TRACE_FIELDS if k in fields})
    tracer = trace.get_tracer("outbox-dispatcher")
    span_kind = getattr(trace.SpanKind, kind)
    with tracer.start_as_current_span(name, context=parent, kind=span_kind, attributes=attributes):
        yield current_trace_fields()
