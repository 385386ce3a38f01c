"""The Helm chart, rendered and linted offline by Helm's own SDK (``helm-python-sdk``, no binary).

Every render (default values and several non-default sets) must pass ``kubernetes-validate``
strictly; an ``OutboxDispatcher`` it renders must pass the CRD's own schema; the schema of the
values must refuse bad values; and the CRD shipped in ``crds/`` must be the repository's one.
"""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, ServiceMonitor

from dispatcher.controller.model import DEFAULT_VERSION_TAG, OutboxDispatcherSpec
from dispatcher.controller.report import CONSOLE_URL_ANNOTATION, console_url
from tests.chart import CHART, CRD, K8S_VERSION, NAMESPACE, RELEASE, ROOT, VALUE_SETS, render


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return sorted(
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects
    )


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_render_passes_kubernetes_validate_strict(values: dict[str, Any]) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        if obj["kind"] == "OutboxDispatcher":
            jsonschema.validate(obj, _crd_schema())
            OutboxDispatcherSpec.model_validate(obj["spec"])  # what the operator accepts
        elif obj["apiVersion"].startswith("monitoring.coreos.com/"):
            # kubernetes-validate knows no CRD kinds: checked by test_monitoring_objects
            assert obj["kind"] in ("ServiceMonitor", "PodMonitor")
        else:
            assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_default_render_is_the_operator_and_its_rbac() -> None:
    assert _kinds(render({})) == [
        ("Deployment", "outbox-dispatcher-operator", NAMESPACE),
        ("Role", "outbox-dispatcher-operator", NAMESPACE),
        ("Role", "outbox-dispatcher-operator-lease", NAMESPACE),
        ("RoleBinding", "outbox-dispatcher-operator", NAMESPACE),
        ("RoleBinding", "outbox-dispatcher-operator-lease", NAMESPACE),
        ("ServiceAccount", "outbox-dispatcher-operator", NAMESPACE),
    ]


def test_the_operator_probes_and_metrics_share_its_one_port() -> None:
    (operator,) = (
        o for o in render({"operator": {"metricsPort": 9191}}) if o["kind"] == "Deployment"
    )
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert {"name": "METRICS_PORT", "value": "9191"} in container["env"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert not [a for a in container["args"] if a.startswith("--liveness")]


def test_watch_namespaces_get_a_role_each_and_become_operator_args() -> None:
    objects = render(VALUE_SETS["multi-namespace"], name="rel", namespace="ops")
    roles = {
        (o["kind"], o["metadata"]["namespace"])
        for o in objects
        if "Role" in o["kind"] and o["metadata"]["name"] == "obd-operator"
    }
    assert roles == {(k, ns) for k in ("Role", "RoleBinding") for ns in ("team-a", "team-b")}
    leases = {
        (o["kind"], o["metadata"]["namespace"]) for o in objects if "lease" in o["metadata"]["name"]
    }
    assert leases == {("Role", "ops"), ("RoleBinding", "ops")}  # the Lease is in its own
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "obd-operator", "namespace": "ops"}
        ]
    (deployment,) = (o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg.example.com/op@sha256:" + "ab" * 32
    assert container["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--autoscale-interval=7.5" in container["args"]
    (role, _) = (o for o in objects if o["kind"] == "Role" and "lease" not in o["metadata"]["name"])
    (secrets,) = (r for r in role["rules"] if r["resources"] == ["secrets"])
    assert secrets["resourceNames"] == ["dispatcher-postgres", "dispatcher-redis"]
    (namespace,) = (o for o in objects if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DISPATCHER_ENQUEUER_IMAGE"] == "reg.example.com/enq:1.2"
    assert env["DISPATCHER_WORKER_IMAGE"] == "reg.example.com/w:1.2"
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (10001, 10001, 10001)
    assert (env["DISPATCHER_RUN_AS_USER"], env["DISPATCHER_FS_GROUP"]) == ("10001", "10001")


def test_watch_all_namespaces_is_one_cluster_role_and_two_elected_replicas() -> None:
    objects = render(VALUE_SETS["all-namespaces-ha"])
    assert _kinds([o for o in objects if "Role" in o["kind"]]) == [
        ("ClusterRole", "outbox-dispatcher-operator", None),
        ("ClusterRoleBinding", "outbox-dispatcher-operator", None),
        ("Role", "outbox-dispatcher-operator-lease", NAMESPACE),
        ("RoleBinding", "outbox-dispatcher-operator-lease", NAMESPACE),
    ]
    (cluster_role,) = (o for o in objects if o["kind"] == "ClusterRole")
    (role,) = (o for o in render({}) if o["kind"] == "Role" and "lease" not in str(o))
    assert cluster_role["rules"] == role["rules"]  # the same calls, in every namespace
    (deployment,) = (o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "--all-namespaces"
    assert not [a for a in args if a.startswith("--namespace")]
    assert "--lease-name=outbox-dispatcher-operator" in args


def test_without_leader_election_one_replica_is_recreated_and_no_lease_is_granted() -> None:
    objects = render(VALUE_SETS["single-unelected"])
    assert not [o for o in objects if "lease" in o["metadata"]["name"]]
    (deployment,) = (o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-election" in args


@pytest.mark.parametrize("values", [{}, VALUE_SETS["multi-namespace"]], ids=["default", "obd"])
def test_the_lease_is_owned_by_the_operators_deployment(values: dict[str, Any]) -> None:
    """``helm uninstall`` deletes the Deployment; the garbage collector then deletes the Lease
    it owns (the operator creates the Lease, so Helm does not know it)."""
    objects = render(values)
    (deployment,) = (o for o in objects if o["kind"] == "Deployment")
    name = deployment["metadata"]["name"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {f"--lease-name={name}", f"--lease-owner={name}"} <= set(args)
    lease_role = ("Role", f"{name}-lease")
    (role,) = (o for o in objects if (o["kind"], o["metadata"]["name"]) == lease_role)
    owner = {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [name]}
    assert {**owner, "verbs": ["get"]} in role["rules"]


def test_optional_dispatcher_pins_no_image_and_references_secrets() -> None:
    """Images left out follow the operator (its env), so a chart upgrade upgrades the pods."""
    (cr,) = (o for o in render(VALUE_SETS["with-dispatcher"]) if o["kind"] == "OutboxDispatcher")
    spec = cr["spec"]
    assert "image" not in spec.get("enqueuer", {})
    assert [q.get("image") for q in spec["queues"]] == [None, "reg.example.com/pdf:3"]
    assert spec["postgres"] == {"secretRef": {"name": "dispatcher-postgres", "key": "url"}}
    assert set(spec["redis"]) == {"secretRef", "cluster", "requireAof"}
    assert not [o for o in render({}) if o["kind"] == "OutboxDispatcher"]


def test_the_console_is_off_by_default_and_on_is_a_pod_a_service_and_the_status_url() -> None:
    assert not [o for o in render({}) if "console" in o["metadata"]["name"]]
    objects = render(VALUE_SETS["console"])
    (deployment,) = (
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{RELEASE}-console"
    )
    (service,) = (o for o in objects if o["kind"] == "Service")
    (cr,) = (o for o in objects if o["kind"] == "OutboxDispatcher")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}"
    assert container["command"] == ["dispatcher", "console"]
    assert container["args"] == ["--host=0.0.0.0", "--port=8080", "--refresh=2"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["DATABASE_URL"] == {"secretKeyRef": {"name": "dispatcher-postgres", "key": "url"}}
    assert env["REDIS_URL"] == {"secretKeyRef": {"name": "redis-console", "key": "url"}}
    assert env["REDIS_CLUSTER"] == "1"
    assert env["DISPATCHER_CONSOLE_TOKEN"] == {
        "secretKeyRef": {"name": "console-token", "key": "token"}
    }
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not pod["automountServiceAccountToken"]  # it never talks to the Kubernetes API
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    url = f"http://{RELEASE}-console.{NAMESPACE}.svc:80/"
    assert cr["metadata"]["annotations"] == {CONSOLE_URL_ANNOTATION: url}
    assert console_url(cr["metadata"]) == url  # what the operator writes to status.consoleUrl

    read_only = render({"console": {"enabled": True}})
    (container,) = next(
        o for o in read_only if o["kind"] == "Deployment" and "console" in o["metadata"]["name"]
    )["spec"]["template"]["spec"]["containers"]
    assert "DISPATCHER_CONSOLE_TOKEN" not in {e["name"] for e in container["env"]}


def test_the_chart_requires_aof_by_default() -> None:
    """Without AOF a Redis restart loses the streams: the chart's pods refuse such a Redis."""
    (cr,) = (o for o in render(VALUE_SETS["with-dispatcher"]) if o["kind"] == "OutboxDispatcher")
    assert cr["spec"]["redis"]["requireAof"] is True
    assert OutboxDispatcherSpec.model_validate(cr["spec"]).redis.require_aof


def test_operator_image_defaults_to_the_app_version_everywhere() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert chart["appVersion"] == DEFAULT_VERSION_TAG
    assert f'version = "{DEFAULT_VERSION_TAG}"' in pyproject
    (deployment,) = (o for o in render({}) if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"outbox-dispatcher-operator:{DEFAULT_VERSION_TAG}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DISPATCHER_ENQUEUER_IMAGE"] == f"outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}"
    assert env["DISPATCHER_WORKER_IMAGE"] == f"outbox-dispatcher-worker:{DEFAULT_VERSION_TAG}"


def _closed_schema(model: Any) -> dict[str, Any]:
    """JSON schema of a monitoring.coreos.com/v1 kind, from models generated from the Prometheus
    Operator's own CRDs, with unknown fields refused (as kubernetes-validate's strict mode does
    for core kinds): a typo fails here rather than being pruned silently by the API server."""
    schema: dict[str, Any] = model.model_json_schema(by_alias=True)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


MONITORS = {"ServiceMonitor": ServiceMonitor, "PodMonitor": PodMonitor}


def test_monitoring_objects() -> None:
    assert not [o for o in render({}) if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    objects = render(VALUE_SETS["monitoring"])
    (service,) = (o for o in objects if o["kind"] == "Service")
    (monitor,) = (o for o in objects if o["kind"] == "ServiceMonitor")
    (pods,) = (o for o in objects if o["kind"] == "PodMonitor")
    (operator,) = (o for o in objects if o["kind"] == "Deployment")
    for obj in (monitor, pods):
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        jsonschema.validate(obj, _closed_schema(MONITORS[obj["kind"]]))
        assert obj["metadata"]["labels"]["release"] == "prom"
    assert kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    # The Service selects the operator pod, on the port its container exposes as "metrics".
    pod_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = operator["spec"]["template"]["spec"]["containers"][0]
    metrics = next(p for p in container["ports"] if p["name"] == "metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert {"name": "METRICS_PORT", "value": str(metrics["containerPort"])} in container["env"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    # The PodMonitor selects what the operator renders, in every watched namespace.
    from dispatcher.controller.identity import (
        Owner,
        instance_labels,
        object_labels,
        worker_selector,
    )
    from dispatcher.controller.pods import METRICS_PORT

    owner = Owner(name="orders", namespace="team-a", uid="u")
    selector = pods["spec"]["selector"]
    for labels in (
        object_labels(instance_labels(owner, "enqueuer")),
        object_labels(worker_selector(owner, "q")),
    ):
        assert selector["matchLabels"].items() <= labels.items()
        (expression,) = selector["matchExpressions"]
        assert labels[expression["key"]] in expression["values"]
    assert (
        object_labels(instance_labels(owner, "migrate"))["app.kubernetes.io/component"]
        not in (selector["matchExpressions"][0]["values"])
    )
    assert pods["spec"]["namespaceSelector"]["matchNames"] == ["team-a", "team-b"]
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert METRICS_PORT == 9090


def test_per_role_credentials_pass_through_to_the_resource() -> None:
    (cr,) = (
        o for o in render(VALUE_SETS["per-role-credentials"]) if o["kind"] == "OutboxDispatcher"
    )
    redis = cr["spec"]["redis"]
    assert "secretRef" not in redis
    assert redis["workerSecretRef"] == {"name": "redis-worker", "key": "url"}
    spec = OutboxDispatcherSpec.model_validate(cr["spec"])
    assert spec.redis.secret_for("operator").name == "redis-operator"
    assert spec.postgres.migration().name == "pg-owner"
    assert spec.migrate is False


def test_a_numeric_tag_from_set_is_kept_as_the_tag() -> None:
    (deployment,) = (o for o in render(VALUE_SETS["numeric-tag"]) if o["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "outbox-dispatcher-operator:1234567"


def test_chart_lints_clean() -> None:
    for values in VALUE_SETS.values():
        report = helm.lint(
            CHART, copy.deepcopy(values), strict=True, namespace=NAMESPACE, kube_version="v1.32.0"
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems, report
        assert not report["errors"], report


BAD_VALUES = {
    "unknown key": {"replicaCount": 2},
    "inline database URL": {
        "dispatcher": {"spec": {"postgres": {"url": "postgresql://app:pw@db/app"}}}
    },
    "secretRef without key": {"dispatcher": {"spec": {"redis": {"secretRef": {"key": None}}}}},
    "secretRef name": {"dispatcher": {"spec": {"redis": {"secretRef": {"name": "Not_DNS"}}}}},
    "log level": {"operator": {"logLevel": "LOUD"}},
    "pull policy": {"operator": {"image": {"pullPolicy": "Sometimes"}}},
    "autoscale interval": {"operator": {"autoscaleInterval": 0}},
    "namespace glob": {"operator": {"watchNamespaces": ["team-*"]}},
    "namespaces as a string": {"operator": {"watchNamespaces": "team-a"}},
    "dispatcher name too long": {"dispatcher": {"name": "x" * 51}},
    "bad handler": {"dispatcher": {"spec": {"queues": [{"name": "q", "handler": "nocolon"}]}}},
    "digest": {"operator": {"image": {"digest": "latest"}}},
    "redis without any URL": {
        "dispatcher": {
            "spec": {"redis": {"secretRef": None, "workerSecretRef": {"name": "w", "key": "u"}}}
        }
    },
    "monitor interval": {"monitoring": {"podMonitor": {"interval": "soon"}}},
    "two operators without leader election": {"operator": {"replicas": 2, "leaderElection": False}},
    "console on a privileged port": {"console": {"port": 80}},
    "the old liveness port": {"operator": {"healthPort": 8080}},  # one port now: metricsPort
    "console service type": {"console": {"service": {"type": "ExternalName", "port": 80}}},
}


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=list(BAD_VALUES))
def test_values_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(values)
        with pytest.raises(helm.HelmValuesError):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_values_schema_accepts_the_documented_value_sets(values: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(copy.deepcopy(values))


def test_every_value_is_documented_by_a_comment() -> None:
    """Each setting (a key with a value on its line, above the spec/resources payloads) has a
    comment right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    payload_indent: int | None = None  # inside dispatcher.spec or a resources block
    for n, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(":")
        if not colon or line.lstrip().startswith("#"):
            continue
        inside = payload_indent is not None and indent > payload_indent
        if inside and not (key == "queues" and lines[n - 1].lstrip().startswith("#")):
            continue
        payload_indent = indent if key in ("spec", "resources") else None
        if value.strip():
            assert lines[n - 1].lstrip().startswith("#"), f"values.yaml:{n + 1} {line.strip()}"


@pytest.mark.parametrize(
    "copy_path",
    [
        "charts/outbox-dispatcher/crds/outboxdispatchers.yaml",
        "deploy/base/crds/outboxdispatchers.yaml",
    ],
)
def test_crd_copies_are_byte_identical_to_the_source(copy_path: str) -> None:
    assert (ROOT / copy_path).read_bytes() == CRD.read_bytes(), (
        f"{copy_path} drifted from crds/outboxdispatchers.yaml: cp crds/outboxdispatchers.yaml "
        f"{copy_path}"
    )


def test_chart_ships_exactly_the_crd() -> None:
    with helm.Chart.load(CHART) as chart:
        crds = chart.crds
    assert [c["filename"] for c in crds] == ["outbox-dispatcher/crds/outboxdispatchers.yaml"]
    assert yaml.safe_load(crds[0]["data"]) == yaml.safe_load(CRD.read_text())
