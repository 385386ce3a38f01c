"""The operator's own Prometheus metrics: reconciles, migrations and the autoscaler's view.

One ``OperatorMetrics`` per ``Operator`` on a registry it is given (the process registry in
``dispatcher operator``, which serves it on ``--metrics-port``; a fresh one in tests). The
per-queue gauges are what the autoscaler measured and chose, labelled by the dispatcher's
namespace and name, and removed when the dispatcher or the queue goes.
The enqueuer's and the worker's are ``dispatcher.outbox.metrics`` and
``dispatcher.worker.worker_metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from dispatcher.controller.report import Pass
from dispatcher.observability import PrefixedMetrics

__all__ = ["OperatorMetrics"]

_QUEUE = ["namespace", "dispatcher", "queue"]


class OperatorMetrics:
    """The counters, histogram and gauges the operator updates."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        declare = PrefixedMetrics(registry, prefix="dispatcher_operator_")
        self.reconciles = declare.counter(
            "reconciles",
            "Passes over an OutboxDispatcher, by outcome (applied; failed: stopped before "
            "applying; migrating: the enqueuer waits for its migration Job).",
            ["outcome"],
        )
        self.reconcile_seconds = declare.histogram(
            "reconcile_seconds", "Time of one pass (reconcile and autoscale)."
        )
        self.autoscale_ticks = declare.counter(
            "autoscale_ticks",
            "Backlog measurements of passes that applied, by outcome (ok, redis_unavailable).",
            ["outcome"],
        )
        self.scale_events = declare.counter(
            "scale_events", "Worker Deployments rescaled, by direction (up, down).", ["direction"]
        )
        self.backlog = declare.gauge(
            "queue_backlog",
            "Entries of a queue not yet completed, as the autoscaler last measured them.",
            _QUEUE,
        )
        self.replicas = declare.gauge(
            "queue_replicas", "Worker replicas of a queue the autoscaler last set.", _QUEUE
        )

    def count_pass(self, *, namespace: str, dispatcher: str, result: Pass) -> None:
        """One pass over a dispatcher: it both reconciles and autoscales."""
        migration = result.migration
        if not result.applied:
            outcome = "failed"
        elif migration is not None and not migration.done:
            outcome = "migrating"
        else:
            outcome = "applied"
        self.reconciles.labels(outcome).inc()
        if not result.applied:
            return
        self.autoscale_ticks.labels("ok" if result.measured else "redis_unavailable").inc()
        for direction in result.scaled:
            self.scale_events.labels(direction).inc()
        for row in result.queues:
            self.queue(
                namespace=namespace,
                dispatcher=dispatcher,
                queue=row["name"],
                backlog=row.get("backlog"),
                replicas=int(row.get("replicas") or 0),
            )
        kept = frozenset(r["name"] for r in result.queues)
        self.forget(namespace=namespace, dispatcher=dispatcher, keep=kept)

    def queue(
        self, *, namespace: str, dispatcher: str, queue: str, backlog: int | None, replicas: int
    ) -> None:
        labels = (namespace, dispatcher, queue)
        if backlog is not None:
            self.backlog.labels(*labels).set(backlog)
        self.replicas.labels(*labels).set(replicas)

    def forget(
        self, *, namespace: str, dispatcher: str, keep: frozenset[str] = frozenset()
    ) -> None:
        """Drop the gauges of a deleted dispatcher (or of its queues not in ``keep``)."""
        for gauge in (self.backlog, self.replicas):  # prometheus_client lists children nowhere else
            for labels in list(gauge._metrics):
                if labels[:2] == (namespace, dispatcher) and labels[2] not in keep:
                    gauge.remove(*labels)
