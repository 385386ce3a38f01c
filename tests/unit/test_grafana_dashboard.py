"""The Grafana dashboard queries only metrics the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.worker.worker_metrics import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "outbox-dispatcher.json"
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def exported_names() -> set[str]:
    names = set()
    enqueuer, worker = CollectorRegistry(), CollectorRegistry()
    EnqueuerMetrics(enqueuer)
    WorkerMetrics(worker)
    for registry in (enqueuer, worker):
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
            names.add(family.name)
    return names


def _family(sample_name: str) -> str:
    for suffix in SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


def test_every_dashboard_metric_is_exported() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bdispatcher_[a-z_]+", e)}
    exported = exported_names()
    missing = {m for m in used if m not in exported and _family(m) not in exported}
    assert used, "the dashboard queries something"
    assert missing == set()
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


# Gauges every worker pod exports with the same value (a stream's length and pending count are
# properties of the stream, not of the pod that measured them).
PER_STREAM_GAUGES = ("dispatcher_worker_stream_length", "dispatcher_worker_stream_pending")


def test_per_stream_gauges_are_deduplicated_across_pods_before_summing() -> None:
    """Summing them over pods reads N times too high with N workers: one value per stream first."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    for gauge in PER_STREAM_GAUGES:
        using = [e for e in exprs if gauge in e]
        assert using, gauge
        for expr in using:
            inner = re.search(r"(max|min|avg) by \(([^)]*)\) \(" + gauge + r"\)", expr)
            assert inner is not None, expr
            assert "stream" in [label.strip() for label in inner.group(2).split(",")], expr
