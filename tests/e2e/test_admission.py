"""Admission on the real API server: what ``kubectl apply`` refuses before the operator sees it.

Each CEL rule of the CRD (``x-kubernetes-validations``; the operator's model keeps a twin of
each as a second line) refuses a resource that breaks it, with the rule's message, and
accepts the same resource put right. ``queues`` is a list-map keyed by name: two field
managers each server-side apply their own queue and both stay; a duplicate name is refused.
No operator runs: only the API server, with the CRD of this tree, in a namespace of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.controller.crd import cel_rules
from dispatcher.controller.limits_spec import BURST_RULE
from dispatcher.controller.model import MAX_NAME, MAX_RUNS_CONFLICT
from dispatcher.controller.podsettings import (
    ENV_RULE,
    LABEL_RULE,
    MOUNT_RULE,
    TMP_MOUNT_RULE,
    TMP_VOLUME_RULE,
)
from tests.e2e.cluster_objects import kubectl
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

NS = "admission"


@pytest.fixture(scope="module")
def namespace(cluster: Cluster, crd: str) -> Iterator[str]:
    kubectl(cluster, "create", "namespace", NS)
    yield NS
    kubectl(cluster, "delete", "namespace", NS, "--wait=false")


def resource(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "postgres": {"secretRef": {"name": "db", "key": "url"}},
            "redis": {"secretRef": {"name": "redis", "key": "url"}},
            **spec,
        },
    }


def queue(name: str = "q", **fields: Any) -> dict[str, Any]:
    return {"name": name, "handler": "app.tasks:run", **fields}


def apply(cluster: Cluster, obj: dict[str, Any], *flags: str) -> str:
    return kubectl(cluster, "apply", *flags, "-f", "-", stdin=json.dumps(obj))


SCRATCH = {"name": "scratch", "emptyDir": {}}
# Per rule: its message, a resource that breaks it, the same resource put right.
CASES = [
    pytest.param(
        ENV_RULE["message"],
        resource("env", queues=[queue(env=[{"name": "REDIS_URL", "value": "redis://other"}])]),
        resource("env", queues=[queue(env=[{"name": "APP_REDIS_URL", "value": "redis://o"}])]),
        id="reserved-env",
    ),
    pytest.param(
        TMP_VOLUME_RULE["message"],
        resource("tmp-volume", enqueuer={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        resource("tmp-volume", enqueuer={"volumes": [SCRATCH]}),
        id="tmp-volume",
    ),
    pytest.param(
        TMP_MOUNT_RULE["message"],
        resource(
            "tmp-mount",
            queues=[
                queue(volumes=[SCRATCH], volumeMounts=[{"name": "scratch", "mountPath": "/tmp/"}])
            ],
        ),
        resource(
            "tmp-mount",
            queues=[
                queue(
                    volumes=[SCRATCH], volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}]
                )
            ],
        ),
        id="tmp-mount",
    ),
    pytest.param(
        MOUNT_RULE["message"],
        resource("orphan", enqueuer={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]}),
        resource(
            "orphan",
            enqueuer={
                "volumes": [{"name": "cfg", "configMap": {"name": "app"}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
            },
        ),
        id="orphan-mount",
    ),
    pytest.param(
        LABEL_RULE["message"],
        resource("labels", queues=[queue(podLabels={"app.kubernetes.io/instance": "mine"})]),
        resource("labels", queues=[queue(podLabels={"team": "payments"})]),
        id="managed-label",
    ),
    pytest.param(
        "minReplicas must be <= maxReplicas",
        resource("replicas", queues=[queue(minReplicas=3, maxReplicas=1)]),
        resource("replicas", queues=[queue(minReplicas=1, maxReplicas=3)]),
        id="min-above-max",
    ),
    pytest.param(
        MAX_RUNS_CONFLICT,
        resource("runs", queues=[queue(maxRuns=3, maxDeliveries=4)]),
        resource("runs", queues=[queue(maxRuns=3, maxDeliveries=3)]),
        id="two-run-limits",
    ),
    pytest.param(
        "set secretRef, or all of enqueuerSecretRef, workerSecretRef and operatorSecretRef",
        resource("redis", redis={"workerSecretRef": {"name": "w", "key": "url"}}),
        resource("redis", redis={"secretRef": {"name": "r", "key": "url"}}),
        id="redis-role-without-url",
    ),
    pytest.param(
        BURST_RULE["message"],
        resource("burst", queues=[queue(limits={"maxInFlight": 4, "burst": 5})]),
        resource("burst", queues=[queue(limits={"maxInFlight": 4, "rate": 20, "burst": 5})]),
        id="burst-without-rate",
    ),
    pytest.param(
        f"metadata.name must be at most {MAX_NAME} characters",
        resource("n" * (MAX_NAME + 1)),
        resource("n" * MAX_NAME),
        id="long-name",
    ),
]


def test_every_cel_rule_of_the_crd_has_a_case() -> None:
    assert {rule["message"] for _, rule in cel_rules()} == {case.values[0] for case in CASES}


@pytest.mark.parametrize(("message", "bad", "good"), CASES)
def test_kubectl_apply_refuses_what_a_cel_rule_forbids_with_its_message(
    cluster: Cluster, namespace: str, message: str, bad: dict[str, Any], good: dict[str, Any]
) -> None:
    with pytest.raises(RuntimeError) as refused:
        apply(cluster, bad)
    assert message in str(refused.value)
    assert "is invalid" in str(refused.value)
    apply(cluster, good)
    name = good["metadata"]["name"]
    stored = json.loads(kubectl(cluster, "-n", namespace, "get", "obd", name, "-o", "json"))
    assert stored["spec"]["postgres"] == good["spec"]["postgres"]


def test_queues_merge_by_name_under_server_side_apply(cluster: Cluster, namespace: str) -> None:
    """Two field managers (say, two teams' GitOps) each own their queue of one dispatcher."""
    apply(cluster, resource("shared", queues=[queue("emails")]), "--server-side",
          "--field-manager=team-a")  # fmt: skip
    theirs = {**resource("shared", queues=[queue("invoices")])}
    theirs["spec"] = {"queues": theirs["spec"]["queues"]}  # only what team B owns
    apply(cluster, theirs, "--server-side", "--field-manager=team-b")

    def names() -> list[str]:
        got = json.loads(kubectl(cluster, "-n", namespace, "get", "obd", "shared", "-o", "json"))
        return [q["name"] for q in got["spec"]["queues"]]

    assert names() == ["emails", "invoices"]
    # Team A applies again with its queue changed: team B's queue is not theirs to drop.
    apply(cluster, resource("shared", queues=[queue("emails", maxReplicas=4)]), "--server-side",
          "--field-manager=team-a")  # fmt: skip
    assert names() == ["emails", "invoices"]
    # And team B removes its own.
    theirs["spec"] = {"queues": []}
    apply(cluster, theirs, "--server-side", "--field-manager=team-b")
    assert names() == ["emails"]


@pytest.mark.parametrize(
    ("twice", "message"),
    [
        pytest.param(
            resource("twice", queues=[queue("emails"), queue("emails", handler="m:g")]),
            'spec.queues[1]: Duplicate value: {"name":"emails"}',
            id="queue",
        ),
        pytest.param(
            resource("twice", enqueuer={"env": [{"name": "A", "value": "1"}, {"name": "A"}]}),
            'spec.enqueuer.env[1]: Duplicate value: {"name":"A"}',
            id="env",
        ),
        pytest.param(
            resource("twice", enqueuer={"volumes": [SCRATCH, {**SCRATCH, "emptyDir": {}}]}),
            'spec.enqueuer.volumes[1]: Duplicate value: {"name":"scratch"}',
            id="volume",
        ),
    ],
)
def test_a_duplicate_key_of_a_list_map_is_refused(
    cluster: Cluster, namespace: str, twice: dict[str, Any], message: str
) -> None:
    with pytest.raises(RuntimeError) as refused:
        apply(cluster, twice)
    assert message in str(refused.value)
