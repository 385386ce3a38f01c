"""``observe_ages``: the same histogram as observing each value, bucket by bucket;
``EnqueuerMetrics.count``: rows counted under their queue, labels kept by the object."""

from __future__ import annotations

import collections

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from dispatcher.outbox.metrics import EnqueuerMetrics, observe_ages
from dispatcher.stream import task_stream

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1, 10)


def histogram() -> Histogram:
    return Histogram("h", "h", buckets=BUCKETS, registry=CollectorRegistry())


def samples(h: Histogram) -> dict[tuple[str, str], float]:
    (metric,) = h.collect()
    return {
        (s.name, s.labels.get("le", "")): s.value for s in metric.samples if s.name != "h_created"
    }


@given(
    ages=st.lists(st.sampled_from([*BUCKETS, 0.0]) | st.floats(0, 20), max_size=50),
    plus=st.sampled_from([0.0, 0.0005]) | st.floats(0, 2),
)
def test_bulk_observe_matches_one_by_one(ages: list[float], plus: float) -> None:
    one, bulk = histogram(), histogram()
    for age in ages:
        one.observe(age + plus)
    observe_ages(bulk, ages, plus=plus)
    expected, got = samples(one), samples(bulk)
    assert {k: v for k, v in got.items() if k[0] != "h_sum"} == {
        k: v for k, v in expected.items() if k[0] != "h_sum"
    }
    assert abs(got[("h_sum", "")] - expected[("h_sum", "")]) <= 1e-9 * (1 + len(ages) * 20)


def processed(metrics: EnqueuerMetrics) -> dict[str, float]:
    (metric,) = metrics.processed.collect()
    return {s.labels["queue"]: s.value for s in metric.samples if s.name.endswith("_total")}


def test_rows_are_counted_under_their_queue_by_each_enqueuers_own_metrics() -> None:
    first, second = EnqueuerMetrics(CollectorRegistry()), EnqueuerMetrics(CollectorRegistry())
    rows = collections.Counter(
        {task_stream("mail", 0): 3, task_stream("mail", 1): 2, "not.a.task.stream": 1}
    )
    first.count(first.processed, rows)
    first.count(first.processed, collections.Counter({task_stream("pay", 0): 4}))
    assert processed(first) == {"mail": 5.0, "other": 1.0, "pay": 4.0}
    assert processed(second) == {}
