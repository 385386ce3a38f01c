"""The process kubelet's pure parts: env resolution, command lines, images, pod phase."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from dispatcher._testing.cluster.binaries import ROOT
from dispatcher._testing.cluster.kubelet.env import (
    Refs,
    command_line,
    expand,
    references,
    resolve_env,
)
from dispatcher._testing.cluster.kubelet.images import entrypoints, image_stage
from dispatcher._testing.cluster.kubelet.status import ContainerState, phase, pod_status

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"serviceAccountName": "runner"},
}
CONTAINER: dict[str, Any] = {
    "name": "c",
    "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}, "prefix": "S_"}],
    "env": [
        {"name": "PLAIN", "value": "v"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "url"}}},
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "BOTH", "value": "$(PLAIN)-$(NS)-$(UNDEFINED)-$$(PLAIN)"},
    ],
}
REFS = Refs(
    secrets={"s": {"k": "sv"}, "s2": {"url": "postgresql://h/db"}},
    configmaps={"cm": {"a": "1", "PLAIN": "overridden"}},
)


def test_env_resolves_every_source_in_order() -> None:
    env = resolve_env(POD, CONTAINER, refs=REFS, pod_ip="10.213.1.2", host_ip="h", node_name="n")
    assert env == {
        "a": "1",
        "PLAIN": "v",  # env wins over envFrom
        "S_k": "sv",
        "FROM_SECRET": "postgresql://h/db",
        "FROM_CM": "1",
        "NAME": "p",
        "NS": "ns",
        "IP": "10.213.1.2",
        "NODE": "n",
        "SA": "runner",
        "LABEL": "x",
        "BOTH": "v-ns-$(UNDEFINED)-$(PLAIN)",
    }


def test_env_references_and_missing_ones() -> None:
    assert references(CONTAINER) == ({"s", "s2"}, {"cm"})
    with pytest.raises(LookupError, match="s2/url"):
        resolve_env(
            POD,
            CONTAINER,
            refs=Refs(configmaps=REFS.configmaps, secrets={"s": {}}),
            pod_ip="",
            host_ip="",
            node_name="",
        )
    assert Refs.secret_data({"data": {"k": base64.b64encode(b"v").decode()}}) == {"k": "v"}


def test_command_line_falls_back_to_the_image_entrypoint() -> None:
    env = {"NS": "team"}
    args = {"name": "c", "args": ["--namespace=$(NS)"]}
    assert command_line(args, env, entrypoint=["dispatcher", "operator"]) == [
        "dispatcher",
        "operator",
        "--namespace=team",
    ]
    own = {**args, "command": ["python", "-c"]}
    assert command_line(own, env, entrypoint=["x"]) == ["python", "-c", "--namespace=team"]
    with pytest.raises(LookupError):
        command_line(args, env, entrypoint=None)
    assert expand("$$$(NS)", env) == "$team"


def test_our_images_map_to_the_dockerfile_entrypoints() -> None:
    found = entrypoints(ROOT / "Dockerfile")
    assert found["operator"] == ["dispatcher", "operator"]
    assert found["worker"] == ["dispatcher", "worker"]
    assert image_stage("registry.example/outbox-dispatcher-worker:0.1.0") == "worker"
    assert image_stage("outbox-dispatcher-enqueuer@sha256:abc") == "enqueuer"
    assert image_stage("postgres:16") is None


def _c(**kw: Any) -> ContainerState:
    return ContainerState(name="c", image="i", **kw)


@pytest.mark.parametrize(
    ("states", "policy", "expected"),
    [
        ([_c()], "Always", "Pending"),
        ([_c(pid=1)], "Never", "Running"),
        ([_c(exit_code=0)], "Never", "Succeeded"),
        ([_c(exit_code=3)], "Never", "Failed"),
        ([_c(exit_code=0), _c(exit_code=1)], "Never", "Failed"),
        ([_c(exit_code=3)], "OnFailure", "Running"),
        ([_c(exit_code=0)], "OnFailure", "Succeeded"),
        ([_c(exit_code=0)], "Always", "Running"),
        ([_c(exit_code=0), _c(pid=2)], "Never", "Running"),
    ],
)
def test_phase(states: list[ContainerState], policy: str, expected: str) -> None:
    assert phase(states, restart_policy=policy) == expected


def test_pod_status_ready_only_when_every_container_is() -> None:
    transitions: dict[str, tuple[str, str]] = {}
    both = [_c(pid=1, ready=True, started_at="t"), _c(pid=2, ready=False, started_at="t")]
    kw: dict[str, Any] = {
        "restart_policy": "Always",
        "pod_ip": "10.213.0.9",
        "host_ip": "h",
        "start_time": "t",
        "transitions": transitions,
    }
    status = pod_status(both, **kw)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == "False"
    assert status["podIP"] == "10.213.0.9"
    ready = pod_status([both[0]], **kw)
    assert {c["type"]: c["status"] for c in ready["conditions"]}["Ready"] == "True"
    failed = pod_status([_c(exit_code=3, finished_at="t2")], **{**kw, "restart_policy": "Never"})
    (container,) = failed["containerStatuses"]
    assert failed["phase"] == "Failed"
    assert container["state"]["terminated"]["exitCode"] == 3
    assert container["state"]["terminated"]["reason"] == "Error"
