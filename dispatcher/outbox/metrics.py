"""Prometheus metrics of the enqueuer (``dispatcher_outbox_*``).

The worker's twin is ``dispatcher.worker.metrics``, the operator's
``controller.metrics``: one metrics module per process kind.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import operator
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from dispatcher.stream.naming import queue_of_stream

__all__ = [
    "BACKPRESSURE",
    "BATCHES",
    "COMMIT_TO_PUBLISH",
    "DLQ",
    "FAILED",
    "IDLE_ANNOUNCED",
    "IN_FLIGHT",
    "LISTENER_CONNECTED",
    "OUTBOX_DEPTH",
    "PROCESSED",
    "PUBLISH_LATENCY",
    "RECOVERED",
    "UNSETTLED",
    "observe_ages",
    "queue_label",
]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

PROCESSED = Counter("dispatcher_outbox_processed", "Outbox rows published and deleted", ["queue"])
FAILED = Counter("dispatcher_outbox_failed", "Outbox rows whose publish failed", ["queue"])
DLQ = Counter("dispatcher_outbox_dlq", "Outbox rows moved to outbox_dlq", ["queue"])
RECOVERED = Counter(
    "dispatcher_outbox_recovered",
    "Rows of unsettled batches: made suspects, or (claimed alone) charged an attempt",
    ["outcome"],
)
UNSETTLED = Counter(
    "dispatcher_outbox_unsettled_batches",
    "Batches whose settling transaction failed (rows rolled back, published again)",
)
BACKPRESSURE = Gauge(
    "dispatcher_outbox_backpressure",
    "1 while claims are paused because Redis memory is above the high mark",
)
BATCHES = Counter("dispatcher_outbox_batches", "Claim batches processed (non-empty)")
IN_FLIGHT = Gauge("dispatcher_outbox_in_flight", "Rows locked by this process's open batches")
PUBLISH_LATENCY = Histogram(
    "dispatcher_outbox_publish_seconds",
    "Duration of one pipelined publish of a batch",
    buckets=_LATENCY_BUCKETS,
)
COMMIT_TO_PUBLISH = Histogram(
    "dispatcher_outbox_commit_to_publish_seconds",
    "Row creation (its transaction's start) to its entry stored in Redis",
    buckets=_LATENCY_BUCKETS,
)
OUTBOX_DEPTH = Gauge(
    "dispatcher_outbox_depth",
    "Outbox rows by status; IN_FLIGHT: rows held by open batches (also PENDING or RETRY)",
    ["status"],
)
IDLE_ANNOUNCED = Counter(
    "dispatcher_outbox_idle_announcements",
    "Times this enqueuer announced itself idle (outbox inserts NOTIFY until it withdraws)",
)
LISTENER_CONNECTED = Gauge(
    "dispatcher_outbox_listener_connected", "1 while the LISTEN connection is up"
)


@functools.lru_cache(maxsize=4096)
def queue_label(stream: str) -> str:
    return queue_of_stream(stream) or "other"


def observe_ages(histogram: Histogram, ages: Sequence[float], *, plus: float) -> None:
    """``histogram.observe(age + plus)`` for every age, as one add per bucket.

    ``observe`` scans the buckets and takes a lock once per value, which was the
    largest share of the enqueuer's CPU per row once PostgreSQL packs the entries.
    Without the client's bucket internals (another version), it observes one by one.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for age in ages:
            histogram.observe(age + plus)
        return
    values = list(map(operator.add, ages, itertools.repeat(plus)))  # in C, as the rest
    counts = collections.Counter(map(functools.partial(bisect.bisect_left, bounds), values))
    for i, n in counts.items():
        buckets[i].inc(n)
    total.inc(sum(values))
