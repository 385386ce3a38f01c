"""Why an unavailable Deployment's Pods do not run: the scheduler's word, read from the Pods."""

from __future__ import annotations

from dispatcher.controller.conditions import Reason, Rollout
from dispatcher.controller.report import Pass, verdicts
from dispatcher.controller.unschedulable import pod_selector, unschedulable

SAID = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."


def pod(*conditions: dict[str, str]) -> dict[str, object]:
    return {"status": {"phase": "Pending", "conditions": list(conditions)}}


def test_a_pod_no_node_takes_is_reported_with_the_schedulers_message() -> None:
    pending = pod({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "message": SAID})  # fmt: skip
    assert unschedulable([pending, pending]) == f"2 Pod(s) unschedulable: {SAID}"


def test_scheduled_or_untried_pods_are_not_unschedulable() -> None:
    scheduled = pod({"type": "PodScheduled", "status": "True"})
    waiting = pod({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"})
    assert unschedulable([scheduled, waiting, pod()]) is None
    assert unschedulable([{}]) is None


def test_the_pods_are_selected_by_the_deployments_match_labels() -> None:
    deployment = {"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}}}}
    assert pod_selector(deployment) == "a=1,b=2"


def test_ready_names_the_unschedulable_deployment_before_the_plain_unavailable_one() -> None:
    rollout = Rollout(
        unavailable=("x-worker-a", "x-worker-b"),
        rolling=(),
        unschedulable=(("x-worker-b", f"1 Pod(s) unschedulable: {SAID}"),),
    )
    ready = verdicts(Pass(rollout=rollout, applied=True))[0]
    assert (ready.type, ready.status, ready.reason) == ("Ready", "False", Reason.PODS_UNSCHEDULABLE)
    assert ready.message == f"x-worker-b: 1 Pod(s) unschedulable: {SAID}"
