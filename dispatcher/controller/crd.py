"""Render the ``OutboxDispatcher`` CRD from the pydantic models in ``dispatcher.controller.model``.

Pydantic's JSON Schema is turned into a Kubernetes *structural* schema:
``$ref`` inlined, ``Optional`` unwrapped, titles dropped, object defaults
reduced to ``{}`` (the API server then fills nested defaults), CEL rules kept.
``python -m dispatcher.controller.crd`` prints the CRD; ``crds/outboxdispatchers.yaml``
is that output, and ``tests/unit/test_controller_crd.py`` fails if they differ.
``--write`` also regenerates ``dispatcher/controller/schemas/core-v1.json`` (the core/v1
pod-setting types, from the Kubernetes OpenAPI that ``kubernetes-validate``
ships) before the CRD that embeds them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from dispatcher.controller.conditions import OutboxDispatcherStatus
from dispatcher.controller.coretypes import CORE_SCHEMAS_PATH, K8S_VERSION, build_core_schemas
from dispatcher.controller.model import NAME_RULE, OutboxDispatcherSpec
from dispatcher.controller.resource import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
)

__all__ = ["CRD_PATH", "build_crd", "cel_rules", "core_schemas_json", "crd_yaml", "structural"]

_ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = _ROOT / "crds" / "outboxdispatchers.yaml"
# Copies shipped with the kustomize base and the Helm chart (kept identical by a test).
CRD_COPIES = (
    _ROOT / "deploy" / "base" / "crds" / "outboxdispatchers.yaml",
    _ROOT / "charts" / "outbox-dispatcher" / "crds" / "outboxdispatchers.yaml",
)

_KEEP = {
    "type",
    "format",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "pattern",
    "required",
    "x-kubernetes-validations",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One pydantic JSON Schema node as a structural OpenAPI v3 node."""
    defs = defs if defs is not None else schema.get("$defs", {})
    node = _resolve(schema, defs)
    if node.get("x-kubernetes-int-or-string"):
        return {"x-kubernetes-int-or-string": True, "anyOf": node["anyOf"]}
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP}
    if "const" in node:
        out["enum"] = [node["const"]]
    if node.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {
                name: structural(sub, defs) for name, sub in node["properties"].items()
            }
        if isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = structural(node["additionalProperties"], defs)
        if "maxLength" in out:  # pydantic's max_length on a dict
            out["maxProperties"] = out.pop("maxLength")
        if isinstance(out.get("default"), dict):
            out["default"] = {}
    if node.get("type") == "array":
        out["items"] = structural(node["items"], defs)
    return out


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref`` and unwrap ``anyOf: [X, null]`` (an optional field)."""
    node = dict(schema)
    if "$ref" in node:
        ref = node.pop("$ref").rsplit("/", 1)[-1]
        node = {**defs[ref], **node}
    options = [o for o in node.get("anyOf", []) if o.get("type") != "null"]
    if "anyOf" in node and len(options) == 1:
        inner = _resolve(options[0], defs)
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            rest.pop("default")
        node = {**inner, **rest}
    return node


def _schema(model: type[Any]) -> dict[str, Any]:
    raw: dict[str, Any] = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw)


def build_crd() -> dict[str, Any]:
    """The full CustomResourceDefinition manifest."""
    spec = _schema(OutboxDispatcherSpec)
    status = _schema(OutboxDispatcherStatus)
    for name, prop in status["properties"].items():  # the operator may write nulls
        if name != "conditions":
            prop["nullable"] = True
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Dispatch a PostgreSQL transactional outbox to "
                            "sharded Redis Streams and run autoscaled workers per queue.",
                            "required": ["spec"],
                            "x-kubernetes-validations": [NAME_RULE],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def cel_rules(
    node: dict[str, Any] | None = None, path: str = ""
) -> list[tuple[str, dict[str, str]]]:
    """Every CEL rule of the CRD with the path of the node it checks (``spec.queues[*]``)."""
    if node is None:
        node = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = [(path, rule) for rule in node.get("x-kubernetes-validations", [])]
    for name, sub in node.get("properties", {}).items():
        found += cel_rules(sub, f"{path}.{name}".lstrip("."))
    for key, suffix in (("items", "[*]"), ("additionalProperties", ".*")):
        if isinstance(node.get(key), dict):
            found += cel_rules(node[key], path + suffix)
    return found


def _printer_columns() -> list[dict[str, Any]]:
    """What ``kubectl get obd`` prints; ``-o wide`` adds the ``priority: 1`` ones. Each is a
    status field the operator writes (``dispatcher.controller.glance``): a column shows only
    the first value of a list, so none reads one."""
    ready = '.status.conditions[?(@.type=="Ready")]'
    wide = {"priority": 1}
    return [
        {"name": "Shards", "type": "integer", "jsonPath": ".status.shards"},
        {"name": "Queues", "type": "string", "jsonPath": ".status.queueNames"},
        {"name": "Workers", "type": "string", "jsonPath": ".status.workers",
         "description": "worker pods ready/wanted"},
        {"name": "Backlog", "type": "integer", "jsonPath": ".status.backlog",
         "description": "entries not yet completed"},
        {"name": "Ready", "type": "string", "jsonPath": f"{ready}.status"},
        {"name": "Enqueuers", "type": "string", "jsonPath": ".status.enqueuers",
         "description": "enqueuer pods ready/wanted", **wide},
        {"name": "Pending", "type": "integer", "jsonPath": ".status.pending",
         "description": "entries delivered, not yet acked", **wide},
        {"name": "Reason", "type": "string", "jsonPath": f"{ready}.reason", **wide},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    header = (
        "# Generated by `python -m dispatcher.controller.crd --write`"
        " from dispatcher/controller/model.py.\n"
    )
    body = yaml.dump(build_crd(), Dumper=_NoAliases, sort_keys=False, width=100)
    return header + body


def core_schemas_json() -> str:
    """``dispatcher/controller/schemas/core-v1.json`` from the official OpenAPI (dev only)."""
    import json

    import kubernetes_validate  # type: ignore[import-untyped]

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    openapi = json.loads((root / f"v{K8S_VERSION}-local" / "_definitions.json").read_text())
    return json.dumps(build_core_schemas(openapi["$defs"]), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        CORE_SCHEMAS_PATH.write_text(core_schemas_json())
        # The model read the old file at import: regenerate the CRD in a fresh interpreter.
        import subprocess

        subprocess.run(
            [sys.executable, "-m", "dispatcher.controller.crd", "--write-crd"], check=True
        )
    elif sys.argv[1:] == ["--write-crd"]:
        for path in (CRD_PATH, *CRD_COPIES):
            if path.parent.is_dir():
                path.write_text(crd_yaml())
    else:
        sys.stdout.write(crd_yaml())
