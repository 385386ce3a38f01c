"""Prometheus metrics of the enqueuer (``dispatcher_outbox_*``).

Each ``OutboxEnqueuer`` registers its metrics in the registry it is given; the
CLI passes the process-wide default registry and serves it on ``/metrics``,
tests and embedders may pass their own so several enqueuers can live in one
process. The names are what dashboards and the chart query: keep them.

The worker's twin is ``dispatcher.worker.worker_metrics``, the operator's
``dispatcher.controller.operator_metrics``: one metrics module per process kind.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import operator
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from dispatcher.observability import PrefixedMetrics
from dispatcher.stream.naming import queue_of_stream

__all__ = ["EnqueuerMetrics", "observe_ages"]

_LABELS = 4096
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class EnqueuerMetrics:
    """The counters, histograms and gauges one enqueuer updates."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._queues: dict[str, str] = {}  # stream -> its queue's label, at most _LABELS
        declare = PrefixedMetrics(registry, prefix="dispatcher_outbox_")
        q = ["queue"]
        self.processed = declare.counter("processed", "Outbox rows published and deleted", q)
        self.failed = declare.counter("failed", "Outbox rows whose publish failed", q)
        self.dlq = declare.counter("dlq", "Outbox rows moved to outbox_dlq", q)
        self.recovered = declare.counter(
            "recovered",
            "Rows of unsettled batches: made suspects, or (claimed alone) charged an attempt",
            ["outcome"],
        )
        self.unsettled = declare.counter(
            "unsettled_batches",
            "Batches whose settling transaction failed (rows rolled back, published again)",
        )
        self.batches = declare.counter("batches", "Claim batches processed (non-empty)")
        self.notifications_ignored = declare.counter(
            "notifications_ignored",
            "Notifications on outbox_new with a payload (the trigger sends none): not trusted",
        )
        self.idle_flag_taken = declare.counter(
            "idle_announcements",
            "Times this enqueuer took the idle flag (outbox inserts NOTIFY until it drops it)",
        )
        self.publish_latency = declare.histogram(
            "publish_seconds",
            "Duration of one pipelined publish of a batch",
            buckets=_LATENCY_BUCKETS,
        )
        self.commit_to_publish = declare.histogram(
            "commit_to_publish_seconds",
            "Row creation (its transaction's start) to its entry stored in Redis",
            buckets=_LATENCY_BUCKETS,
        )
        self._add_gauges(declare)

    def count(self, counter: Any, by_stream: collections.Counter[str]) -> None:
        """Adds each stream's rows to ``counter`` under its queue's label ("other" when
        the stream names no queue); the labels are remembered by this object, not the process."""
        by_queue: collections.Counter[str] = collections.Counter()
        for stream, n in by_stream.items():
            queue = self._queues.get(stream)
            if queue is None:
                if len(self._queues) >= _LABELS:  # rows naming ever new streams stay bounded
                    self._queues.clear()
                queue = self._queues[stream] = queue_of_stream(stream) or "other"
            by_queue[queue] += n
        for queue, n in by_queue.items():
            counter.labels(queue).inc(n)

    def _add_gauges(self, declare: PrefixedMetrics) -> None:
        self.backpressure = declare.gauge(
            "backpressure", "1 while claims are paused because Redis memory is above the high mark"
        )
        self.in_flight = declare.gauge("in_flight", "Rows locked by this process's open batches")
        self.outbox_depth = declare.gauge(
            "depth",
            "Outbox rows by status; IN_FLIGHT: rows held by open batches (also PENDING or RETRY)",
            ["status"],
        )
        self.listener_connected = declare.gauge(
            "listener_connected", "1 while the LISTEN connection is up"
        )


def observe_ages(histogram: Histogram, ages: Sequence[float], *, plus: float) -> None:
    """``histogram.observe(age + plus)`` for every age, as one add per bucket.

    ``observe`` scans the buckets and takes a lock once per value, which was the
    largest share of the enqueuer's CPU per row after the entries were packed in bulk.
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
