"""What is left in a namespace: every object of every namespaced kind the API server serves.

After ``helm uninstall`` nothing of the release may be left. A fixed list of kinds cannot
see what it leaves out (the operator's Lease was missed that way), so the kinds come from
discovery (``kubectl api-resources --namespaced --verbs=list``), CRDs' kinds included.
Left aside: what Kubernetes itself keeps in every namespace (the ``default``
ServiceAccount, the ``kube-root-ca.crt`` ConfigMap), and Events, which are records of what
happened (they expire after the API server's ``--event-ttl``), not objects of anyone's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection

__all__ = ["leftovers"]

KUBERNETES_OWN = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}
RECORDS = {"events", "events.events.k8s.io"}


def leftovers(
    kubectl: Callable[..., str], namespace: str, *, besides: Collection[tuple[str, str]] = ()
) -> list[str]:
    """``Kind/name`` of every object in ``namespace`` but Kubernetes' own and ``besides``."""
    served = kubectl("api-resources", "--namespaced", "--verbs=list", "-o", "name").split()
    kinds = sorted(set(served) - RECORDS)
    assert "leases.coordination.k8s.io" in kinds, served  # discovery answered in full
    listing = json.loads(kubectl("-n", namespace, "get", ",".join(kinds), "-o", "json"))
    kept = KUBERNETES_OWN | set(besides)
    return sorted(
        f"{o['kind']}/{o['metadata']['name']}"
        for o in listing["items"]
        if (o["kind"], o["metadata"]["name"]) not in kept
    )
