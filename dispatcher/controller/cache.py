"""The operator's watch cache: the Deployments, PodDisruptionBudgets and Jobs it owns.

Passes read live objects from here, not with GETs. ``dispatcher.controller.informer`` fills it: a
label-selected LIST replaces what it held of a kind in a namespace (relist semantics: an
object deleted while the watch was cut disappears here too), then the watch's events
update it. Every write puts the API's answer back, and an event never replaces a newer
version with an older one (``resourceVersion`` orders the writes of one object).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.controller.identity import COMPONENT_LABEL, Owner, controller_uid

__all__ = ["Cache"]

Key = tuple[str, str]


@dataclass
class Cache:
    """What the lists and watches saw, by kind and (namespace, name)."""

    objects: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    _synced: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    @property
    def deployments(self) -> dict[Key, dict[str, Any]]:
        return self.of("Deployment")

    def of(self, kind: str) -> dict[Key, dict[str, Any]]:
        return self.objects.setdefault(kind, {})

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.of(kind).get((namespace, name))

    def put(self, body: Mapping[str, Any], kind: str = "Deployment") -> None:
        """Keep ``body`` unless the cache already holds a newer version of it."""
        held = self.of(kind)
        key = _key(body)
        old = held.get(key)
        if old is None or _version(body) >= _version(old):
            held[key] = dict(body)

    def drop(self, body: Mapping[str, Any], kind: str = "Deployment") -> None:
        self.of(kind).pop(_key(body), None)

    def replace(
        self, kind: str, namespace: str, items: Iterable[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """What a LIST of ``kind`` in ``namespace`` found becomes all the cache holds of it
        there; returns the objects that appeared, changed or went (their owners need a pass)."""
        held = self.of(kind)
        before = {k: v for k, v in held.items() if k[0] == namespace}
        found = {_key(o): dict(o) for o in items}
        for key in before:
            held.pop(key)
        held.update(found)
        gone = [v for k, v in before.items() if k not in found]
        return gone + [v for k, v in found.items() if _version(before.get(k) or {}) != _version(v)]

    def synced(self, kind: str, namespace: str) -> asyncio.Event:
        """Set once a LIST of ``kind`` in ``namespace`` filled the cache."""
        return self._synced.setdefault((kind, namespace), asyncio.Event())

    def owned(self, owner: Owner, component: str, kind: str = "Deployment") -> list[dict[str, Any]]:
        """The objects of one component that ``owner`` controls: told by the owner reference's
        uid, not by labels, so objects labelled by an earlier version are found too."""
        return [
            d
            for (ns, _), d in self.of(kind).items()
            if ns == owner.namespace
            and controller_uid(d) == owner.uid
            and (d.get("metadata", {}).get("labels") or {}).get(COMPONENT_LABEL) == component
        ]


def _key(body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata", {})
    return (str(meta.get("namespace")), str(meta.get("name")))


def _version(body: Mapping[str, Any]) -> int:
    """resourceVersion as a number where it is one (it orders writes of one object)."""
    raw = str(body.get("metadata", {}).get("resourceVersion") or "0")
    return int(raw) if raw.isdigit() else 0
