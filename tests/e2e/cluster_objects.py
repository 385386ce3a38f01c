"""kubectl on the local cluster, and what the e2e tests read from its objects.

The one copy of the helpers every e2e module needs: run kubectl, get an object, read a
condition of its status, list a namespace's Events. A test module imports them from here
(or, for the operator run in the test's loop, from ``tests.e2e.live_dispatcher``), never
from another test module.
"""

from __future__ import annotations

import json
from typing import Any

from tools.cluster import HOST_IP, Cluster

__all__ = ["condition", "condition_status", "events_in", "for_pods", "get", "kubectl"]


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    """What kubectl printed; a failure raises with what it said."""
    return cluster.run("kubectl", *args, stdin=stdin)


def get(cluster: Cluster, kind: str, name: str, *, namespace: str) -> dict[str, Any]:
    """The object (one that is not there is an error)."""
    found: dict[str, Any] = json.loads(
        kubectl(cluster, "-n", namespace, "get", kind, name, "-o", "json")
    )
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` of the object's status, None while it has none."""
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == type_:
            return dict(found)
    return None


def condition_status(obj: dict[str, Any], type_: str) -> str | None:
    """``"True"``, ``"False"`` or ``"Unknown"``: the status of a condition, None while absent."""
    found = condition(obj, type_)
    return None if found is None else str(found["status"])


def events_in(
    cluster: Cluster, namespace: str, *, reason: str | None = None
) -> list[dict[str, Any]]:
    """The namespace's Events (with ``reason``: only those)."""
    listed = json.loads(kubectl(cluster, "-n", namespace, "get", "events", "-o", "json"))
    return [e for e in listed["items"] if reason is None or e.get("reason") == reason]


def for_pods(url: str) -> str:
    """A server URL of the host (``127.0.0.1``) as pods reach it: the node bridge's address."""
    return url.replace("127.0.0.1", HOST_IP)
