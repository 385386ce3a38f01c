"""The CRD: in sync with the pydantic model, valid for Kubernetes, and its rules at work.

Sample resources are checked the way the API server would: structural defaults
first, then the OpenAPI schema (jsonschema) and the keys of list-maps, then every CEL
rule (``x-kubernetes-validations``, evaluated with cel-python) at its node.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml

from dispatcher.controller.coretypes import CORE_SCHEMAS_PATH, core_schema
from dispatcher.controller.crd import CRD_PATH, build_crd, cel_rules, core_schemas_json, crd_yaml
from dispatcher.controller.model import MAX_RUNS_CONFLICT, OutboxDispatcherSpec
from dispatcher.controller.podsettings import ENV_RULE, LABEL_RULE, TMP_MOUNT_RULE, TMP_VOLUME_RULE

K8S_VERSION = "1.37.0"
EXAMPLES = sorted((Path(CRD_PATH).parent / "examples").glob("*.yaml"))


def _schema() -> dict[str, Any]:
    crd = build_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting, as the API server does before validation."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
    if isinstance(obj, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def cel_errors(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(obj)}):
            errors.append(f"{path or '<root>'}: {rule['message']}")
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj and name != "metadata":
                errors += cel_errors(obj[name], sub, f"{path}.{name}".lstrip("."))
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += cel_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def duplicate_keys(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """A list-map's items must differ in their keys (the API server's "Duplicate value")."""
    errors: list[str] = []
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                errors += duplicate_keys(obj[name], sub, f"{path}.{name}".lstrip("."))
    if isinstance(obj, list) and "items" in schema:
        keys = schema.get("x-kubernetes-list-map-keys")
        seen = set()
        for i, item in enumerate(obj):
            if keys:
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    named = json.dumps(dict(zip(keys, key, strict=True)), separators=(",", ":"))
                    errors.append(f"{path}[{i}]: Duplicate value: {named}")
                seen.add(key)
            errors += duplicate_keys(item, schema["items"], f"{path}[{i}]")
    return errors


def strict_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields are errors (kubectl's default field validation is Strict)."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: strict_fields(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if "items" in out:
        out["items"] = strict_fields(out["items"])
    return out


def validate_cr(cr: dict[str, Any]) -> list[str]:
    """Every message the API server would answer for ``cr`` (empty: accepted)."""
    schema = _schema()
    obj = apply_defaults(copy.deepcopy(cr), schema)
    validator = jsonschema.Draft7Validator(strict_fields(schema))
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
    return errors or duplicate_keys(obj, schema) or cel_errors(obj, schema)


def _cr(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "postgres": {"secretRef": {"name": "db", "key": "url"}},
        "redis": {"secretRef": {"name": "redis", "key": "url"}},
        "queues": [{"name": "emails", "handler": "app.tasks:send"}],
    }
    base.update(spec)
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": base,
    }


def test_crd_file_matches_the_model() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), "run: python -m dispatcher.controller.crd --write"


def test_crd_passes_kubernetes_validate_strict() -> None:
    assert kubernetes_validate.validate(build_crd(), K8S_VERSION, strict=True)
    assert yaml.safe_load(CRD_PATH.read_text()) == build_crd()


def test_crd_names_scope_and_columns() -> None:
    spec = build_crd()["spec"]
    assert spec["group"] == "dispatch.composer.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "outboxdispatchers"
    assert spec["names"]["kind"] == "OutboxDispatcher"
    assert spec["names"]["shortNames"] == ["obd"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    default = [c["name"] for c in columns if not c.get("priority")]
    assert default == ["Shards", "Queues", "Workers", "Backlog", "Ready", "Age"]
    assert [c["name"] for c in columns if c.get("priority")] == ["Enqueuers", "Pending", "Reason"]


def test_each_column_reads_one_status_field_the_operator_writes() -> None:
    """A column over a list prints its first value only (QUEUES showed one queue of two)."""
    version = build_crd()["spec"]["versions"][0]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        assert "[*]" not in path, column
        assert path.startswith((".status.", ".metadata.creationTimestamp")), column
        if "[" not in path and path.startswith(".status."):
            assert status[path.removeprefix(".status.")]["type"] == column["type"], column


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_resources_are_accepted(path: Path) -> None:
    cr = yaml.safe_load(path.read_text())
    assert validate_cr(cr) == []
    OutboxDispatcherSpec.model_validate(apply_defaults(cr["spec"], _schema()["properties"]["spec"]))


BAD = [
    pytest.param({"shards": 0}, "shards: 0 is less than the minimum of 1", id="zero-shards"),
    pytest.param({"shards": 5000}, "shards: 5000 is greater than the maximum", id="shards-high"),
    pytest.param({"postgres": {}}, "'secretRef' is a required property", id="no-secret-ref"),
    pytest.param(
        {"redis": {"secretRef": {"name": "r", "key": "url"}, "url": "redis://x"}},
        "redis: Additional properties",
        id="inline-url",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "minReplicas": 5, "maxReplicas": 2}]},
        "spec.queues[0]: minReplicas must be <= maxReplicas",
        id="min-above-max",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "maxRuns": 3, "maxDeliveries": 4}]},
        "spec.queues[0]: maxDeliveries is the old name of maxRuns",
        id="two-run-limits",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "handlerTimeoutSeconds": -1}]},
        "handlerTimeoutSeconds: -1 is less than the minimum of 0",
        id="negative-timeout",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f"}, {"name": "a", "handler": "m:g"}]},
        'spec.queues[1]: Duplicate value: {"name":"a"}',
        id="duplicate-queue",
    ),
    pytest.param(
        {"enqueuer": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
        'spec.enqueuer.env[1]: Duplicate value: {"name":"A"}',
        id="duplicate-env",
    ),
    pytest.param(
        {"enqueuer": {"volumes": [{"name": "v" * 64, "emptyDir": {}}]}},
        "is too long",
        id="long-volume-name",
    ),
    pytest.param(
        {"queues": [{"name": "a.b", "handler": "m:f"}]},
        "queues.0.name: 'a.b' does not match",
        id="dotted-queue",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "no-colon"}]},
        "queues.0.handler: 'no-colon' does not match",
        id="bad-handler",
    ),
    pytest.param({"logFormat": "xml"}, "logFormat: 'xml' is not one of", id="bad-log-format"),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "limits": {"burst": 5}}]},
        "spec.queues[0].limits: burst requires rate",
        id="burst-without-rate",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "limits": {"maxInFlight": -1}}]},
        "limits.maxInFlight: -1 is less than the minimum of 1",
        id="negative-max-in-flight",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "limits": {"rate": 0, "burst": 2}}]},
        "limits.rate: 0 is less than the minimum of 0.001",
        id="zero-rate",
    ),
    pytest.param(
        {"redis": {"enqueuerSecretRef": {"name": "r", "key": "url"}}},
        "spec.redis: set secretRef, or all of enqueuerSecretRef",
        id="a-role-without-url",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "env": [{"value": "x"}]}]},
        "'name' is a required property",
        id="env-without-name",
    ),
    pytest.param(
        {"enqueuer": {"tolerations": [{"key": "k", "operator": "Equal", "bogus": 1}]}},
        "Additional properties are not allowed ('bogus'",
        id="toleration-unknown-field",
    ),
    pytest.param(
        {"enqueuer": {"affinity": {"nodeAffinity": "everywhere"}}},
        "'everywhere' is not of type 'object'",
        id="affinity-not-an-object",
    ),
    pytest.param(
        {"queues": [{"name": "a", "handler": "m:f", "targetBacklogPerReplica": 0}]},
        "targetBacklogPerReplica: 0 is less than the minimum of 1",
        id="zero-target",
    ),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_resources_are_rejected_with_the_right_message(
    spec: dict[str, Any], message: str
) -> None:
    errors = validate_cr(_cr(**spec))
    assert any(message in e for e in errors), errors


def test_a_long_name_is_rejected() -> None:
    cr = _cr()
    cr["metadata"]["name"] = "x" * 51
    assert validate_cr(cr) == ["<root>: metadata.name must be at most 50 characters"]


def test_unknown_spec_fields_are_rejected() -> None:
    assert any("Additional properties" in e for e in validate_cr(_cr(replicas=3)))


@pytest.mark.parametrize(
    ("limits", "runs"),
    [
        ({}, 5),
        ({"maxRuns": 3}, 3),
        ({"maxDeliveries": 4}, 4),
        ({"maxRuns": 2, "maxDeliveries": 2}, 2),
    ],
)
def test_max_deliveries_is_still_accepted_as_the_old_name_of_max_runs(
    limits: dict[str, int], runs: int
) -> None:
    cr = _cr(queues=[{"name": "a", "handler": "m:f", **limits}])
    assert validate_cr(cr) == []
    spec = OutboxDispatcherSpec.model_validate(cr["spec"])
    assert spec.queues[0].runs_limit == runs


def test_images_have_no_default_so_they_follow_the_operator() -> None:
    """A default would be written into every stored resource and pin the first version."""
    spec = _schema()["properties"]["spec"]["properties"]
    assert "default" not in spec["enqueuer"]["properties"]["image"]
    assert "default" not in spec["queues"]["items"]["properties"]["image"]
    stored = apply_defaults(
        {"postgres": {}, "redis": {}, "enqueuer": {}, "queues": [{"name": "q"}]},
        _schema()["properties"]["spec"],
    )
    assert "image" not in stored["enqueuer"]
    assert "image" not in stored["queues"][0]


def test_core_type_schemas_are_the_official_kubernetes_ones() -> None:
    """``schemas/core-v1.json`` is generated from kubernetes-validate's OpenAPI."""
    assert CORE_SCHEMAS_PATH.read_text() == core_schemas_json(), (
        "run: python -m dispatcher.controller.crd --write"
    )
    spec = _schema()["properties"]["spec"]["properties"]
    lists = {
        "env": "EnvVar",
        "volumes": "Volume",
        "volumeMounts": "VolumeMount",
        "tolerations": "Toleration",
        "topologySpreadConstraints": "TopologySpreadConstraint",
    }
    for owner in (spec["enqueuer"], spec["queues"]["items"]):
        props = owner["properties"]
        for field, core in lists.items():
            # The official item, with bounds where a CEL rule reads a string.
            items = props[field]["items"]["properties"]
            unbounded = {
                k: {a: b for a, b in v.items() if a != "maxLength"} for k, v in items.items()
            }
            assert unbounded == core_schema(core)["properties"], field
        assert props["affinity"]["properties"] == core_schema("Affinity")["properties"]


@pytest.mark.parametrize(
    ("field", "keys"),
    [
        ("env", ["name"]),
        ("volumes", ["name"]),
        ("volumeMounts", ["mountPath"]),
        ("imagePullSecrets", ["name"]),
        ("topologySpreadConstraints", ["topologyKey", "whenUnsatisfiable"]),
    ],
)
def test_keyed_pod_lists_are_list_maps_as_in_a_pod(field: str, keys: list[str]) -> None:
    """Keyed as Kubernetes keys them in a Pod (its OpenAPI's x-kubernetes-list-map-keys)."""
    spec = _schema()["properties"]["spec"]["properties"]
    for owner in (spec["enqueuer"], spec["queues"]["items"]):
        node = owner["properties"][field]
        assert node["x-kubernetes-list-type"] == "map"
        assert node["x-kubernetes-list-map-keys"] == keys
        assert set(keys) <= set(node["items"]["required"])
    assert spec["queues"]["x-kubernetes-list-map-keys"] == ["name"]


# One resource breaking each CEL rule of the spec, by the rule's message.
BREAKS_RULE = {
    "set secretRef, or all of enqueuerSecretRef, workerSecretRef and operatorSecretRef": {
        "redis": {"workerSecretRef": {"name": "w", "key": "url"}}
    },
    "every volumeMount must name a volume in volumes": {
        "enqueuer": {"volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}]}
    },
    "minReplicas must be <= maxReplicas": {
        "queues": [{"name": "a", "handler": "m:f", "minReplicas": 5, "maxReplicas": 2}]
    },
    MAX_RUNS_CONFLICT: {
        "queues": [{"name": "a", "handler": "m:f", "maxRuns": 3, "maxDeliveries": 4}]
    },
    ENV_RULE["message"]: {
        "queues": [
            {"name": "a", "handler": "m:f", "env": [{"name": "LOG_LEVEL", "value": "DEBUG"}]}
        ]
    },
    TMP_VOLUME_RULE["message"]: {"enqueuer": {"volumes": [{"name": "tmp", "emptyDir": {}}]}},
    TMP_MOUNT_RULE["message"]: {
        "enqueuer": {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp/"}],
        }
    },
    LABEL_RULE["message"]: {
        "queues": [{"name": "a", "handler": "m:f", "podLabels": {"app.kubernetes.io/name": "x"}}]
    },
    "burst requires rate": {"queues": [{"name": "a", "handler": "m:f", "limits": {"burst": 2}}]},
}


def test_every_cel_rule_of_the_spec_has_a_case() -> None:
    spec_rules = {rule["message"] for path, rule in cel_rules() if path.startswith("spec")}
    assert spec_rules == set(BREAKS_RULE)


@pytest.mark.parametrize(("message", "spec"), BREAKS_RULE.items(), ids=range(len(BREAKS_RULE)))
def test_the_model_refuses_what_each_cel_rule_refuses_with_its_message(
    message: str, spec: dict[str, Any]
) -> None:
    """The API server (its CEL) and the operator (the model) say the same thing."""
    assert any(message in e for e in validate_cr(_cr(**spec))), validate_cr(_cr(**spec))
    with pytest.raises(pydantic.ValidationError) as caught:
        OutboxDispatcherSpec.model_validate(_cr(**spec)["spec"])
    assert message in str(caught.value)


def test_crd_fits_a_client_side_apply_annotation() -> None:
    """``kubectl apply`` (client side) stores the object in a 256 KiB annotation."""
    compact = json.dumps(build_crd(), separators=(",", ":"))
    assert len(compact) < 200 * 1024, len(compact)
