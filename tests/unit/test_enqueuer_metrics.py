"""``observe_ages``: the same histogram as observing each value, bucket by bucket."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from dispatcher.outbox.metrics import observe_ages

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
