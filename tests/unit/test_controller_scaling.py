"""The autoscaling policy: clamping, zero backlog, hysteresis, Redis unknown -> hold."""

from __future__ import annotations

import pytest

from dispatcher.controller.scaling import ScalePolicy, ScaleState, decide, recommend

POLICY = ScalePolicy(
    min_replicas=1, max_replicas=10, target_backlog_per_replica=100, stabilization_seconds=300
)


@pytest.mark.parametrize(
    ("backlog", "expected"),
    [(0, 1), (1, 1), (100, 1), (101, 2), (250, 3), (999, 10), (10_000, 10), (-5, 1)],
)
def test_recommend_is_ceil_of_backlog_over_target_clamped(backlog: int, expected: int) -> None:
    assert recommend(backlog, POLICY) == expected


def test_zero_backlog_with_zero_minimum_means_zero_replicas() -> None:
    policy = ScalePolicy(
        min_replicas=0, max_replicas=3, target_backlog_per_replica=10, stabilization_seconds=0
    )
    assert recommend(0, policy) == 0
    assert decide(current=2, backlog=0, policy=policy, state=ScaleState(), now=0).replicas == 0


def test_scale_up_is_immediate_and_clears_a_pending_scale_down() -> None:
    state = ScaleState(down_since=10.0, down_to=2)
    decision = decide(current=3, backlog=800, policy=POLICY, state=state, now=20.0)
    assert decision.replicas == 8
    assert decision.state == ScaleState()


def test_scale_down_waits_for_the_stabilization_window() -> None:
    state = ScaleState()
    for now in (0.0, 100.0, 299.0):
        decision = decide(current=5, backlog=0, policy=POLICY, state=state, now=now)
        assert decision.replicas == 5
        assert decision.recommended == 1
        state = decision.state
    assert state == ScaleState(down_since=0.0, down_to=1)
    decision = decide(current=5, backlog=0, policy=POLICY, state=state, now=300.0)
    assert decision.replicas == 1
    assert decision.state == ScaleState()


def test_scale_down_goes_to_the_highest_recommendation_of_the_window() -> None:
    state = ScaleState()
    for now, backlog in ((0.0, 0), (100.0, 350), (200.0, 0)):
        state = decide(current=6, backlog=backlog, policy=POLICY, state=state, now=now).state
    decision = decide(current=6, backlog=0, policy=POLICY, state=state, now=301.0)
    assert decision.replicas == 4


def test_a_burst_inside_the_window_resets_it() -> None:
    state = decide(current=5, backlog=0, policy=POLICY, state=ScaleState(), now=0).state
    state = decide(current=5, backlog=500, policy=POLICY, state=state, now=200).state
    assert state == ScaleState()
    decision = decide(current=5, backlog=0, policy=POLICY, state=state, now=301)
    assert decision.replicas == 5  # a new window started at 301


def test_unknown_backlog_holds_size_and_window() -> None:
    state = ScaleState(down_since=0.0, down_to=1)
    decision = decide(current=4, backlog=None, policy=POLICY, state=state, now=10_000)
    assert decision.replicas == 4
    assert decision.recommended is None
    assert decision.state == state


def test_bounds_are_obeyed_at_once() -> None:
    assert decide(current=0, backlog=0, policy=POLICY, state=ScaleState(), now=0).replicas == 1
    assert decide(current=20, backlog=0, policy=POLICY, state=ScaleState(), now=0).replicas == 10


def test_policy_rejects_inverted_bounds() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        ScalePolicy(
            min_replicas=3, max_replicas=2, target_backlog_per_replica=1, stabilization_seconds=0
        )
