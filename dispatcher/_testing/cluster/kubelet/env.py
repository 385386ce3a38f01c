"""A container's environment as a kubelet resolves it: pure functions over the Pod and the
Secrets and ConfigMaps it references (fetched by the caller)."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Refs", "command_line", "expand", "references", "resolve_env"]

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class Refs:
    """The data of the Secrets and ConfigMaps a container references, by name (decoded)."""

    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    configmaps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @staticmethod
    def secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
        raw = secret.get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in raw.items()}


def references(container: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The names of the Secrets and of the ConfigMaps the container's env reads."""
    secrets: set[str] = set()
    configmaps: set[str] = set()
    for var in container.get("env") or []:
        source = var.get("valueFrom") or {}
        if "secretKeyRef" in source:
            secrets.add(source["secretKeyRef"]["name"])
        if "configMapKeyRef" in source:
            configmaps.add(source["configMapKeyRef"]["name"])
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            secrets.add(source["secretRef"]["name"])
        if "configMapRef" in source:
            configmaps.add(source["configMapRef"]["name"])
    return secrets, configmaps


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` replaced by a defined variable's value, ``$$`` by ``$``; the rest as written."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _VAR.sub(one, text)


def _field(pod: Mapping[str, Any], path: str, *, pod_ip: str, host_ip: str, node_name: str) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
    }
    if path in simple:
        return str(simple[path])
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ValueError(f"fieldRef {path!r} is not supported")


def _value_from(source: Mapping[str, Any], refs: Refs, **fields: Any) -> str | None:
    if "secretKeyRef" in source or "configMapKeyRef" in source:
        kind = "secretKeyRef" if "secretKeyRef" in source else "configMapKeyRef"
        ref = source[kind]
        store = refs.secrets if kind == "secretKeyRef" else refs.configmaps
        found = (store.get(ref["name"]) or {}).get(ref["key"])
        if found is None and not ref.get("optional"):
            raise LookupError(f"{kind} {ref['name']}/{ref['key']} not found")
        return found
    if "fieldRef" in source:
        return _field(fields["pod"], source["fieldRef"]["fieldPath"], **fields["where"])
    raise ValueError(f"valueFrom {sorted(source)} is not supported")


def resolve_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    refs: Refs,
    pod_ip: str,
    host_ip: str,
    node_name: str,
) -> dict[str, str]:
    """``envFrom`` first, then ``env`` in order, each value expanded against those before it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "secretRef" in source:
            ref, store = source["secretRef"], refs.secrets
        else:
            ref, store = source["configMapRef"], refs.configmaps
        if ref["name"] not in store and not ref.get("optional"):
            raise LookupError(f"envFrom {ref['name']} not found")
        env.update({prefix + k: v for k, v in (store.get(ref["name"]) or {}).items()})
    where = {"pod_ip": pod_ip, "host_ip": host_ip, "node_name": node_name}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            value = _value_from(var["valueFrom"], refs, pod=pod, where=where)
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = expand(var.get("value", ""), env)
    return env


def command_line(
    container: Mapping[str, Any], env: Mapping[str, str], *, entrypoint: list[str] | None
) -> list[str]:
    """command + args (``$(VAR)`` expanded); without ``command``, the image's entrypoint."""
    command = container.get("command") or entrypoint
    if not command:
        raise LookupError(f"container {container.get('name')!r}: no command and no known image")
    return [expand(part, env) for part in [*command, *(container.get("args") or [])]]
