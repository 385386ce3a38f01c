"""A dispatcher at a glance: the status fields ``kubectl get obd`` prints.

A printer column is one JSONPath, and the API server prints only the first value of a list
(``.spec.queues[*].name`` showed one queue of two), so the operator writes what a person
wants to see as plain fields: every queue's name in one string, ready/wanted pods of the
workers and of the enqueuer (as ``kubectl get deployments`` counts them), and the backlog and
pending entries summed over the queues. Pure: from the spec's queues, the owned Deployments
(the watch cache) and the queues' status rows of the pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["GLANCE_FIELDS", "at_a_glance", "ready_of"]

# The status fields this module writes (camelCase, as in the CRD).
GLANCE_FIELDS = ("queueNames", "workers", "enqueuers", "backlog", "pending")


def ready_of(deployments: Iterable[Mapping[str, Any]], *, wanted: int | None = None) -> str:
    """``ready/wanted`` pods over ``deployments`` (``wanted``: the count while none exists)."""
    found = list(deployments)
    if not found and wanted is not None:
        return f"0/{wanted}"
    ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in found)
    want = sum(int((d.get("spec") or {}).get("replicas", 1) or 0) for d in found)
    return f"{ready}/{want}"


def at_a_glance(
    *,
    queues: Sequence[str],
    enqueuers: Sequence[Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    enqueuer_replicas: int,
    rows: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """The glance fields; ``backlog``/``pending`` only when every queue was measured (``rows``:
    the queues' status rows of this pass, None when it did not get that far)."""
    found: dict[str, Any] = {
        "queueNames": ",".join(queues),
        "workers": ready_of(workers),
        "enqueuers": ready_of(enqueuers, wanted=enqueuer_replicas),
    }
    if rows and all(row.get("backlog") is not None for row in rows):
        found["backlog"] = sum(int(row["backlog"]) for row in rows)
        found["pending"] = sum(int(row.get("pending") or 0) for row in rows)
    return found
