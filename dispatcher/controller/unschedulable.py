"""Why an unavailable Deployment's Pods do not run, when the scheduler says so.

A Deployment reports only that replicas are unavailable; a Pod that no node can take says why
in its ``PodScheduled`` condition (reason ``Unschedulable``, the scheduler's message: "0/3
nodes are available: 3 node(s) didn't match Pod's node affinity/selector"). The operator
reads the Pods of its unavailable Deployments only, one list per such Deployment per pass, so
a healthy dispatcher costs no call; ``unschedulable`` is the pure part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["pod_selector", "unschedulable"]


def pod_selector(deployment: Mapping[str, Any]) -> str:
    """The label selector of a Deployment's Pods (its ``matchLabels``), as a query string."""
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def unschedulable(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """ "N Pod(s) unschedulable: <the scheduler's message>" for the Pods no node takes, or
    None when every Pod is scheduled (or not yet tried)."""
    messages = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                messages.append(str(condition.get("message") or "no node fits"))
    if not messages:
        return None
    return f"{len(messages)} Pod(s) unschedulable: {messages[0]}"
