"""Prometheus metrics of the worker runtime (``dispatcher_worker_*``).

Each ``Worker`` registers its metrics in the registry it is given; the CLI
passes the process-wide default registry, tests and embedders may pass their
own so several workers can live in one process. ``for_queue`` hands out the
labelled children of one queue, looked up once and cached, so the per-message
path never resolves labels.

The enqueuer's twin is ``dispatcher.outbox.metrics``, the operator's
``dispatcher.controller.operator_metrics``: one metrics module per process kind.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from dispatcher.observability import PrefixedMetrics
from dispatcher.stream.stats import StreamStats

__all__ = ["QueueMetrics", "WorkerMetrics", "observe_many"]

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """The children of ``WorkerMetrics`` labelled with one queue."""

    handled: Counter
    failed: Counter
    duplicates: Counter
    lease_busy: Counter
    latency: Histogram


class WorkerMetrics:
    """The counters, histogram and gauges one worker updates."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._queues: dict[str, QueueMetrics] = {}
        declare = PrefixedMetrics(registry, prefix="dispatcher_worker_")
        q = ["queue"]
        self.handled = declare.counter("handled", "Messages whose handler succeeded (acked).", q)
        self.failed = declare.counter("failed", "Handler runs that raised (left pending).", q)
        self.dead_lettered = declare.counter(
            "dead_lettered", "Messages moved to workflow.dead.<queue>, by reason.", [*q, "reason"]
        )
        self.duplicates = declare.counter(
            "duplicates_suppressed",
            "Deliveries of an attempt already done: acked without running.",
            q,
        )
        self.lease_busy = declare.counter(
            "lease_busy",
            "Deliveries left pending because another run holds the attempt's lease.",
            q,
        )
        self.latency = declare.histogram(
            "handler_seconds", "Handler run time.", q, buckets=_LATENCY_BUCKETS
        )
        self._add_gauges(declare)

    def _add_gauges(self, declare: PrefixedMetrics) -> None:
        s = ["queue", "stream"]
        self.in_flight = declare.gauge("in_flight", "Handlers running now.")
        # Counted as a plain int on the hot path; the gauge reads it when scraped.
        self.running = 0
        self.in_flight.set_function(lambda: self.running)
        self.streams = declare.gauge("streams", "Shard streams being read.")
        self.stream_length = declare.gauge(
            "stream_length",
            "XLEN of a shard stream: backlog plus in-flight entries (acked ones are deleted).",
            s,
        )
        self.stream_pending = declare.gauge(
            "stream_pending", "Entries delivered to the group and not yet acked.", s
        )

    def for_queue(self, queue: str) -> QueueMetrics:
        found = self._queues.get(queue)
        if found is None:
            found = self._queues[queue] = QueueMetrics(
                handled=self.handled.labels(queue),
                failed=self.failed.labels(queue),
                duplicates=self.duplicates.labels(queue),
                lease_busy=self.lease_busy.labels(queue),
                latency=self.latency.labels(queue),
            )
        return found

    def observe_stream(self, queue: str, stats: StreamStats) -> None:
        self.stream_length.labels(queue, stats.stream).set(stats.length)
        self.stream_pending.labels(queue, stats.stream).set(stats.pending)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, with one update per bucket hit.

    A batch of short runs lands in one or two buckets: counted here, each
    bucket and the sum are updated once (every update takes a lock). A
    histogram without the internals this relies on is observed value by value.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    hits = collections.Counter(bisect.bisect_left(bounds, value) for value in values)
    for index, count in hits.items():
        buckets[index].inc(count)
    total.inc(sum(values))
