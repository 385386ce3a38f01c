"""The operator's watch cache: the Deployments it owns, as the watch last reported them.

Passes read live Deployments from here, not with GETs; every write puts the API's answer
back, and a watch event never replaces a newer version with an older one (``resourceVersion``
orders the writes of one object).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.identity import Owner, controller_uid, instance_labels

__all__ = ["Cache"]

Key = tuple[str, str]


@dataclass
class Cache:
    """What the watches saw: owned Deployments by (namespace, name)."""

    deployments: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def put(self, body: Mapping[str, Any]) -> None:
        """Keep ``body`` unless the cache already holds a newer version of it."""
        meta = body.get("metadata", {})
        key = (str(meta.get("namespace")), str(meta.get("name")))
        held = self.deployments.get(key)
        if held is None or _version(body) >= _version(held):
            self.deployments[key] = dict(body)

    def drop(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        self.deployments.pop((str(meta.get("namespace")), str(meta.get("name"))), None)

    def owned(self, owner: Owner, component: str) -> list[dict[str, Any]]:
        labels = instance_labels(owner, component).items()
        return [
            d
            for (ns, _), d in self.deployments.items()
            if ns == owner.namespace
            and controller_uid(d) == owner.uid
            and labels <= (d.get("metadata", {}).get("labels") or {}).items()
        ]


def _version(body: Mapping[str, Any]) -> int:
    """resourceVersion as a number where it is one (it orders writes of one object)."""
    raw = str(body.get("metadata", {}).get("resourceVersion") or "0")
    return int(raw) if raw.isdigit() else 0
