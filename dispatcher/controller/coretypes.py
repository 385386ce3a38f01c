"""Kubernetes core/v1 types inside the ``OutboxDispatcher`` spec: their schemas and a validator.

Pod settings (``env``, ``volumes``, ``tolerations``, ``affinity``, ...) are the API's own types,
so their schemas are taken from the official Kubernetes OpenAPI (the copy ``kubernetes-validate``
ships) rather than written by hand: ``build_core_schemas`` turns those definitions into
*structural* schemas (references inlined, ``null`` unions dropped, quantities and int-or-string
as ``x-kubernetes-int-or-string``, descriptions dropped to keep the CRD well under the 256 KiB a
client-side ``kubectl apply`` can annotate). The result is vendored as ``schemas/core-v1.json``
(``python -m dispatcher.controller.crd --write`` regenerates it; a test fails when it
drifts), so the operator needs no schema package at run time.

``validate`` checks a value against one of those schemas the way the API server would with
strict field validation (unknown fields refused, bounds, the keys of a list-map unique), so the
operator's model refuses what the CRD refuses even where no API server checked it first (an old
CRD, a mock API). ``CoreList`` is a spec field holding a list of one core type: bounded (CEL rules
need bounds to fit the API server's cost budget), a list-map where Kubernetes keys it (server-side
apply then merges by key, and a duplicate key is refused), with CEL rules on each item.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AfterValidator, WithJsonSchema

__all__ = [
    "CORE_SCHEMAS_PATH",
    "CORE_TYPES",
    "K8S_VERSION",
    "CoreList",
    "build_core_schemas",
    "core_json_schema",
    "core_schema",
    "core_validator",
    "validate",
]

K8S_VERSION = "1.37.0"
CORE_SCHEMAS_PATH = Path(__file__).resolve().parent / "schemas" / "core-v1.json"
_PREFIX = "io.k8s.api.core.v1."
# The core/v1 types a spec may carry, by their short name.
CORE_TYPES = (
    "Affinity",
    "EnvFromSource",
    "EnvVar",
    "LocalObjectReference",
    "Toleration",
    "TopologySpreadConstraint",
    "Volume",
    "VolumeMount",
)
_INT_OR_STRING = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}
_FORMATS = {"int32", "int64", "double", "float", "byte", "date-time"}


def build_core_schemas(definitions: Mapping[str, Any]) -> dict[str, Any]:
    """Structural schemas of ``CORE_TYPES`` from the OpenAPI ``definitions`` (by full name)."""
    return {name: _structural(definitions[_PREFIX + name], definitions) for name in CORE_TYPES}


def _structural(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return _structural(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "oneOf" in node:  # Quantity and IntOrString: a string or a number
        return dict(_INT_OR_STRING)
    types = node.get("type", "object")
    kind = next(t for t in types if t != "null") if isinstance(types, list) else types
    out: dict[str, Any] = {"type": kind}
    if node.get("format") in _FORMATS:
        out["format"] = node["format"]
    for key in ("enum", "required"):
        if key in node:
            out[key] = node[key]
    if "properties" in node:
        out["properties"] = {k: _structural(v, defs) for k, v in sorted(node["properties"].items())}
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _structural(node["additionalProperties"], defs)
    if kind == "array":
        out["items"] = _structural(node["items"], defs)
    return out


@functools.cache
def _schemas() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(CORE_SCHEMAS_PATH.read_text())
    return loaded


def core_schema(name: str) -> dict[str, Any]:
    """The structural schema of core/v1 ``name`` (one of ``CORE_TYPES``)."""
    schema: dict[str, Any] = _schemas()[name]
    return schema


def validate(value: Any, schema: Mapping[str, Any], *, path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema`` (types, required, enums, unknown fields)."""
    where = path or "value"
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, str | int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: must be an integer or a string"]
    kind = schema.get("type")
    checks: dict[str, Callable[[Any], bool]] = {
        "object": lambda v: isinstance(v, Mapping),
        "array": lambda v: isinstance(v, list | tuple),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind in checks and not checks[kind](value):
        return [f"{where}: must be of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: must be one of {', '.join(map(str, schema['enum']))}"]
    if kind == "string" and len(value) > schema.get("maxLength", len(value)):
        return [f"{where}: at most {schema['maxLength']} characters"]
    if kind == "array":
        return _array_errors(value, schema, path=path)
    if kind == "object":
        return _object_errors(value, schema, path=path)
    return []


def _array_errors(value: Sequence[Any], schema: Mapping[str, Any], *, path: str) -> list[str]:
    if len(value) > schema.get("maxItems", len(value)):
        return [f"{path or 'value'}: at most {schema['maxItems']} items"]
    errors = [
        e
        for i, item in enumerate(value)
        for e in validate(item, schema["items"], path=f"{path}[{i}]")
    ]
    keys = schema.get("x-kubernetes-list-map-keys")
    return errors or (_duplicates(value, keys, path=path) if keys else [])


def _duplicates(value: Sequence[Mapping[str, Any]], keys: Sequence[str], *, path: str) -> list[str]:
    """A list-map's items whose keys an earlier item has (the API server's "Duplicate value")."""
    errors, seen = [], set()
    for i, item in enumerate(value):
        key = tuple(item.get(k) for k in keys)
        if key in seen:
            named = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key, strict=True))
            errors.append(f"{path}[{i}]: duplicate {named}")
        seen.add(key)
    return errors


def _object_errors(value: Mapping[str, Any], schema: Mapping[str, Any], *, path: str) -> list[str]:
    prefix = f"{path}." if path else ""
    errors = [f"{prefix}{key}: required" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if properties is not None and key in properties:
            errors += validate(item, properties[key], path=f"{prefix}{key}")
        elif isinstance(extra, Mapping):
            errors += validate(item, extra, path=f"{prefix}{key}")
        elif properties is not None:
            errors.append(f"{prefix}{key}: unknown field")
    return errors


def _checker(schema: Callable[[], Mapping[str, Any]], what: str) -> AfterValidator:
    def check(value: Any) -> Any:
        errors = validate(value, schema())
        if errors:
            raise ValueError(f"not a valid core/v1 {what}: {'; '.join(errors[:5])}")
        return value

    return AfterValidator(check)


def core_validator(name: str) -> AfterValidator:
    """Pydantic metadata: validate a value as core/v1 ``name``."""
    return _checker(lambda: core_schema(name), name)


def core_json_schema(name: str) -> WithJsonSchema:
    """Pydantic metadata: the CRD schema of core/v1 ``name``."""
    return WithJsonSchema({**core_schema(name), "description": f"core/v1 {name}"})


@dataclass(frozen=True, kw_only=True)
class CoreList:
    """A spec field holding a list of core/v1 ``name``: its schema and its validator.

    ``keys`` make it a list-map (as Kubernetes keys that list in a Pod), ``rules`` are CEL rules
    on each item, ``max_lengths`` bound an item's string fields so those rules fit the cost
    budget. The validator checks the same schema (the rules' twins live in the model).
    """

    name: str
    max_items: int
    keys: tuple[str, ...] = ()
    rules: tuple[Mapping[str, str], ...] = ()
    max_lengths: Mapping[str, int] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        item = dict(core_schema(self.name))
        item["properties"] = {
            key: {**sub, "maxLength": self.max_lengths[key]} if key in self.max_lengths else sub
            for key, sub in item["properties"].items()
        }
        if self.keys:
            item["required"] = sorted({*item.get("required", ()), *self.keys})
        if self.rules:
            item["x-kubernetes-validations"] = [dict(rule) for rule in self.rules]
        out: dict[str, Any] = {"type": "array", "maxItems": self.max_items, "items": item}
        if self.keys:
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = list(self.keys)
        return out

    def validator(self) -> AfterValidator:
        return _checker(self.schema, f"{self.name} list")

    def json_schema(self) -> WithJsonSchema:
        return WithJsonSchema({**self.schema(), "description": f"core/v1 {self.name} list"})
