"""Who owns what the operator renders, and what each object is called.

The ``Owner`` (the ``OutboxDispatcher``) and its owner reference, the object names of its
Deployments, budgets and migration Jobs (DNS-1123 labels; a hash suffix keeps a name that
had to be altered distinct), the selector labels of each component, and the uid of an
object's controlling owner, which tells the operator's objects from anyone else's.

The labels follow Kubernetes' recommended ones without sharing a key's meaning with the
chart: ``app.kubernetes.io/instance`` is the Helm release's (Helm's convention, and what
Argo CD's label tracking uses), so the operator never sets it. Which dispatcher an object
belongs to is ``dispatch.composer.dev/dispatcher`` (and ``dispatch.composer.dev/queue``
for a queue's worker), who manages it ``app.kubernetes.io/managed-by`` (the chart's
objects: ``Helm``). A selector of the release (``instance=<release>``) therefore never
matches what a dispatcher owns, whatever the names, and a dispatcher's selector never
matches the release's objects. ``part-of``/``name`` (the application) are shared on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.controller.resource import API_GROUP, API_VERSION, KIND
from dispatcher.stream.naming import fnv1a_32

__all__ = [
    "APP_NAME",
    "COMPONENT_LABEL",
    "DISPATCHER_LABEL",
    "MANAGED_BY",
    "QUEUE_LABEL",
    "Owner",
    "controller_uid",
    "enqueuer_name",
    "instance_labels",
    "migration_job_name",
    "object_labels",
    "worker_name",
    "worker_selector",
]

APP_NAME = "outbox-dispatcher"
MANAGED_BY = "outbox-dispatcher-operator"
QUEUE_LABEL = f"{API_GROUP}/queue"
DISPATCHER_LABEL = f"{API_GROUP}/dispatcher"
COMPONENT_LABEL = "app.kubernetes.io/component"
_MAX_NAME = 63


@dataclass(frozen=True, slots=True)
class Owner:
    """The ``OutboxDispatcher`` that owns what we render."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def controller_uid(manifest: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, if it has one."""
    for ref in manifest.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _dns_name(wanted: str) -> str:
    """``wanted`` as a DNS-1123 label; a hash suffix keeps altered names distinct."""
    clean = wanted.lower().replace("_", "-").replace(".", "-")
    if clean == wanted and len(clean) <= _MAX_NAME:
        return clean
    suffix = f"{fnv1a_32(wanted.encode()):08x}"[:6]
    return f"{clean[: _MAX_NAME - 7].rstrip('-')}-{suffix}"


def enqueuer_name(owner: Owner) -> str:
    return _dns_name(f"{owner.name}-enqueuer")


def worker_name(owner: Owner, queue: str) -> str:
    return _dns_name(f"{owner.name}-worker-{queue}")


def instance_labels(owner: Owner, component: str) -> dict[str, str]:
    """The selector labels of one component of one dispatcher (no ``instance``: the release's)."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        COMPONENT_LABEL: component,
        DISPATCHER_LABEL: owner.name,
    }


def worker_selector(owner: Owner, queue: str) -> dict[str, str]:
    return {**instance_labels(owner, "worker"), QUEUE_LABEL: queue}


def object_labels(selector: dict[str, str]) -> dict[str, str]:
    """The selector labels and the ones that say what the object is part of and who manages it."""
    return {
        **selector,
        "app.kubernetes.io/part-of": APP_NAME,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def migration_job_name(owner: Owner, image: str) -> str:
    """One Job per enqueuer image: a new image (a new schema version) migrates again."""
    digest = f"{fnv1a_32(image.encode()):08x}"
    return f"{_dns_name(f'{owner.name}-migrate')[: _MAX_NAME - 9]}-{digest}"
