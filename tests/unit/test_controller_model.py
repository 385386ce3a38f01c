"""The CR model, the shard decision and the condition list: pure parts of the operator."""

from __future__ import annotations

import datetime

import pydantic
import pytest

from dispatcher.controller.conditions import DEGRADED, READY, set_condition
from dispatcher.controller.limits_spec import limits_to_write
from dispatcher.controller.model import MAX_NAME, OutboxDispatcherSpec
from dispatcher.controller.reconcile import parse_spec
from dispatcher.controller.report import Failure
from dispatcher.controller.shard_policy import ShardDecision, decide_shards, draining_shards
from dispatcher.stream.limit_keys import QueueLimits

SECRETS = {
    "postgres": {"secretRef": {"name": "db", "key": "url"}},
    "redis": {"secretRef": {"name": "redis", "key": "url"}},
}


def test_defaults_and_camel_case_aliases() -> None:
    spec = OutboxDispatcherSpec.model_validate(
        {**SECRETS, "queues": [{"name": "q", "handler": "m:f", "maxReplicas": 3}]}
    )
    assert spec.shards == 4
    assert spec.enqueuer.batch_size == 100
    assert spec.queues[0].max_replicas == 3
    assert spec.queues[0].target_backlog_per_replica == 100
    assert spec.redis.cluster is False
    with pytest.raises(pydantic.ValidationError):
        spec.shards = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ([{"name": "q", "handler": "m:f", "minReplicas": 4, "maxReplicas": 2}], "minReplicas"),
        ([{"name": "q", "handler": "m:f"}, {"name": "q", "handler": "m:g"}], "unique"),
        ([{"name": "q", "handler": "m:f", "maxRuns": 1, "maxDeliveries": 2}], "old name"),
        ([{"name": "q", "handler": "m:f", "limits": {"burst": 2}}], "burst requires rate"),
    ],
)
def test_model_mirrors_the_cel_rules(queues: list[dict[str, object]], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        OutboxDispatcherSpec.model_validate({**SECRETS, "queues": queues})


def test_shard_decisions_follow_the_spec_both_ways() -> None:
    assert decide_shards(desired=4, published=None).action == "set"
    assert decide_shards(desired=4, published=4).action == "keep"
    assert decide_shards(desired=8, published=4).action == "set"
    lowered = decide_shards(desired=2, published=4, draining={"workflow.tasks.a.3": (7, 0)})
    assert (lowered.action, lowered.shards) == ("set", 2)  # removed shards drain, never block


def test_draining_shards_are_removed_shards_of_spec_queues_with_work() -> None:
    streams = {
        "workflow.tasks.a.1": (5, 0),  # in the count
        "workflow.tasks.a.2": (0, 0),  # removed, empty
        "workflow.tasks.a.3": (0, 1),  # removed, one pending
        "workflow.tasks.gone.3": (9, 0),  # a queue no longer in the spec: QueuesDraining's
    }
    assert draining_shards(streams, queues=["a"], shards=2) == {"workflow.tasks.a.3": (0, 1)}


def test_draining_message_lists_each_removed_shard_with_its_work() -> None:
    decision = ShardDecision(
        action="set",
        shards=2,
        draining={"workflow.tasks.a.3": (7, 1), "workflow.tasks.a.2": (0, 2)},
    )
    assert decision.draining_message.endswith(
        "workflow.tasks.a.2 (length 0, pending 2), workflow.tasks.a.3 (length 7, pending 1)"
    )
    assert ShardDecision(action="keep", shards=2).draining_message == ""


def test_condition_transition_time_moves_only_on_a_status_flip() -> None:
    t0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    t1 = t0 + datetime.timedelta(minutes=5)
    conditions = set_condition([], type_=READY, status="True", reason="R", message="", now=t0)
    conditions = set_condition(
        conditions, type_=DEGRADED, status="False", reason="AsExpected", message="", now=t0
    )
    same = set_condition(conditions, type_=READY, status="True", reason="R2", message="m", now=t1)
    assert [c.type for c in same] == [READY, DEGRADED]
    assert same[0].last_transition_time == t0
    assert same[0].reason == "R2"
    flipped = set_condition(same, type_=READY, status="False", reason="X", message="", now=t1)
    assert flipped[0].last_transition_time == t1


def _queue(**fields: object) -> dict[str, object]:
    return {**SECRETS, "queues": [{"name": "q", "handler": "m:f", **fields}]}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _queue(env=[{"name": "REDIS_URL", "value": "redis://x"}]),
            "are set by the operator (REDIS_URL)",
        ),
        (_queue(env=[{"name": "A", "valu": "x"}]), "[0].valu: unknown field"),
        (
            _queue(tolerations=[{"key": "k", "tolerationSeconds": "soon"}]),
            "tolerationSeconds: must be of type integer",
        ),
        (_queue(volumeMounts=[{"name": "cfg", "mountPath": "/etc/x"}]), "'cfg' names none"),
        (_queue(volumes=[{"name": "tmp", "emptyDir": {}}]), "'tmp' is reserved"),
        (
            _queue(podLabels={"app.kubernetes.io/instance": "x"}),
            "are set by the operator (app.kubernetes.io/instance)",
        ),
        (
            _queue(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
            "EnvVar list: [1]: duplicate name='A'",
        ),
        (
            _queue(
                volumes=[{"name": "a", "emptyDir": {}}],
                volumeMounts=[{"name": "a", "mountPath": "/x"}, {"name": "a", "mountPath": "/x"}],
            ),
            "[1]: duplicate mountPath='/x'",
        ),
        (_queue(volumes=[{"name": "v" * 64, "emptyDir": {}}]), "[0].name: at most 63 characters"),
        (_queue(serviceAccountName="Not_DNS"), "serviceAccountName"),
        (_queue(affinity={"nodeAffinity": []}), "nodeAffinity: must be of type object"),
        (
            {**SECRETS, "redis": {"workerSecretRef": {"name": "w", "key": "url"}}},
            "set secretRef, or all of",
        ),
    ],
)
def test_model_refuses_bad_pod_settings_with_a_clear_message(
    spec: dict[str, object], message: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        OutboxDispatcherSpec.model_validate(spec)
    assert message in str(caught.value)


def test_pod_settings_and_role_secrets_parse() -> None:
    spec = OutboxDispatcherSpec.model_validate(
        {
            "postgres": {"secretRef": {"name": "db", "key": "url"}},
            "redis": {
                "enqueuerSecretRef": {"name": "e", "key": "url"},
                "workerSecretRef": {"name": "w", "key": "url"},
                "operatorSecretRef": {"name": "o", "key": "url"},
            },
            "migrate": False,
            "enqueuer": {"nodeSelector": {"pool": "a"}, "priorityClassName": "high"},
            "queues": [
                {
                    "name": "q",
                    "handler": "m:f",
                    "resources": {"requests": {"cpu": "1"}},
                    "tolerations": [{"operator": "Exists"}],
                }
            ],
        }
    )
    assert spec.migrate is False
    assert [spec.redis.secret_for(r).name for r in ("enqueuer", "worker", "operator")] == [
        "e",
        "w",
        "o",
    ]
    assert spec.enqueuer.node_selector == {"pool": "a"}
    assert spec.queues[0].resources.requests == {"cpu": "1"}
    assert spec.queues[0].resources.limits is None
    assert spec.postgres.migration().name == "db"


def test_readme_pod_settings_example_is_a_valid_queue() -> None:
    """The pod settings example of docs/kubernetes.md is accepted by the model (it stays true)."""
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    section = readme.split("## Pod settings", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    queues = yaml.safe_load(block.group(1))["queues"]
    spec = OutboxDispatcherSpec.model_validate({**SECRETS, "queues": queues})
    queue = spec.queues[0]
    assert queue.service_account_name == "invoice-renderer"
    assert queue.affinity is not None
    assert queue.topology_spread_constraints
    assert queue.env_from


def test_queue_limits_in_the_spec_are_the_limits_workers_read() -> None:
    spec = OutboxDispatcherSpec.model_validate(
        {**SECRETS, "queues": [{"name": "q", "handler": "m:f", "limits": {"maxInFlight": 4}}]}
    )
    limits = spec.queues[0].limits
    assert limits is not None
    assert limits.limits() == QueueLimits(max_in_flight=4)
    wanted = {"a": QueueLimits(max_in_flight=4), "b": QueueLimits(rate=2), "c": QueueLimits()}
    wanted |= {"d": QueueLimits(rate=3), "e": QueueLimits(max_in_flight=1)}
    found = {"a": '{"max_in_flight": 4}', "b": "garbage", "c": None}
    # As the operator reads them now: bytes, which may not be UTF-8 (rewritten, not a crash).
    found |= {"d": b'\xff{"rate": 3}', "e": b'{"max_in_flight": 1}'}
    assert limits_to_write(wanted, found) == {
        "b": QueueLimits(rate=2),
        "c": QueueLimits(),
        "d": QueueLimits(rate=3),
    }


def test_parse_spec_reports_what_the_api_server_would_refuse_as_invalid_spec() -> None:
    """The operator's second line behind the CRD's CEL rules: every problem, one line."""
    bad = {
        **SECRETS,
        "queues": [{"name": "q", "handler": "m:f", "minReplicas": 3, "maxReplicas": 1}],
    }
    with pytest.raises(Failure) as caught:
        parse_spec(bad, name="orders")
    assert caught.value.reason == "InvalidSpec"
    assert caught.value.message.startswith("invalid spec: spec.queues.0")
    assert "minReplicas must be <= maxReplicas" in caught.value.message
    with pytest.raises(Failure, match=f"at most {MAX_NAME} characters"):
        parse_spec(SECRETS, name="n" * (MAX_NAME + 1))
    assert parse_spec(SECRETS, name="orders").shards == 4
