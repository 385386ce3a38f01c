"""Metrics declared per registry: every process kind names its metrics with its own prefix."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from dispatcher.controller.operator_metrics import OperatorMetrics
from dispatcher.observability import PrefixedMetrics
from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.worker.worker_metrics import WorkerMetrics


def _names(registry: CollectorRegistry) -> set[str]:
    return {family.name for family in registry.collect()}


def test_declared_metrics_carry_the_prefix_and_live_in_the_given_registry() -> None:
    registry = CollectorRegistry()
    declare = PrefixedMetrics(registry, prefix="demo_")
    declare.counter("runs", "Runs.", ["queue"]).labels("q").inc()
    declare.gauge("depth", "Depth.").set(3)
    declare.histogram("seconds", "Time.", buckets=(0.1, 1)).observe(0.5)
    assert _names(registry) == {"demo_runs", "demo_depth", "demo_seconds"}
    text = generate_latest(registry).decode()
    assert 'demo_runs_total{queue="q"} 1.0' in text
    assert 'demo_seconds_bucket{le="1.0"} 1.0' in text


def test_each_process_kinds_metrics_can_be_declared_twice_on_separate_registries() -> None:
    for make, prefix in (
        (OperatorMetrics, "dispatcher_operator_"),
        (WorkerMetrics, "dispatcher_worker_"),
        (EnqueuerMetrics, "dispatcher_outbox_"),
    ):
        first, second = CollectorRegistry(), CollectorRegistry()
        make(first)
        make(second)  # no "Duplicated timeseries": nothing lands in the process registry
        assert _names(first) == _names(second)
        assert _names(first)
        assert all(name.startswith(prefix) for name in _names(first))
