"""The writes one pass makes to the Kubernetes API besides the status.

Each function is one kind of object: a Deployment or PodDisruptionBudget server-side
applied (``KubeApi.apply``) only when the render differs from what is live (the watch
cache's copy, updated with every answer), the budgets of queues that left the spec deleted,
the migration Job, and the worker Deployments of removed queues kept at one replica until
their streams are empty, then deleted. Problems a user can fix raise ``Failure``.

"Nothing changed" is told without a request: every applied manifest carries
``dispatch.composer.dev/applied-hash``, a digest of the render without it. A live object
whose annotation matches the render, and which still holds every value the render sets
(quantities compared as numbers: the API server stores ``1024Mi`` as ``1Gi``), is left
alone. The digest catches what a superset check cannot (a field the render no longer
sets: the apply removes it); the check catches another manager's change to a field the
operator owns. The annotation travels with the object, so a restarted operator (or another
replica) knows what was applied without remembering it, and without comparing the render
with ``managedFields``, whose field sets would need a parser of their own.

An object gone from the API server (deleted while a watch was cut, before the next relist
says so) is "gone", never an error: an apply creates it again, a patch of it returns None
and the cache forgets it.

An object whose selector is not exactly the render's (labelled by an operator version before
``dispatch.composer.dev/dispatcher`` replaced ``app.kubernetes.io/instance``) is deleted and
created again. A Deployment's selector is immutable; a budget's is not, but an apply keeps
selector keys another field manager owns, and a budget that also requires the old key
selects none of the new pods. The Deployment's pods stop with their grace period while the
new ones start (a one-time restart, which the image upgrade that comes with a new operator
version makes anyway); nothing is lost, the work waits in PostgreSQL and Redis.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from dispatcher.controller.api_requests import APIConflictError, KubeApi, contains
from dispatcher.controller.cache import Cache
from dispatcher.controller.conditions import Reason
from dispatcher.controller.identity import Owner, controller_uid, migration_job_name
from dispatcher.controller.migration import MigrationState, migration_state
from dispatcher.controller.model import OutboxDispatcherSpec
from dispatcher.controller.pods import WorkloadDefaults
from dispatcher.controller.redis_access import Measurement
from dispatcher.controller.render import build_enqueuer_pdb, build_migration_job, build_worker_pdb
from dispatcher.controller.report import Failure
from dispatcher.controller.resource import API_GROUP

__all__ = [
    "APPLIED_HASH",
    "NotYetKnown",
    "apply_budgets",
    "apply_owned",
    "drain_queues",
    "migrate",
    "with_applied_hash",
]

log = logging.getLogger("dispatcher.controller")
Event = tuple[str, str, bool]  # reason, message, warning
APPLIED_HASH = f"{API_GROUP}/applied-hash"


class NotYetKnown(Exception):
    """The watch cache has not been filled yet: try again shortly."""


def with_applied_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` with the digest of itself in the ``applied-hash`` annotation."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:20]
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH: digest}
    return {**manifest, "metadata": meta}


def _unchanged(live: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    wanted = manifest["metadata"]["annotations"][APPLIED_HASH]
    held = (live.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH)
    return held == wanted and contains(live, manifest)


def _selector_changed(live: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """A selector that is not exactly the render's (``contains`` would accept extra keys)."""
    wanted = (manifest.get("spec") or {}).get("selector")
    held = (live.get("spec") or {}).get("selector") or {}
    return wanted is not None and bool(held != wanted)


async def apply_owned(
    *, api: KubeApi, cache: Cache, owner: Owner, manifest: Mapping[str, Any]
) -> bool:
    """Server-side apply one owned object unless nothing changed; whether it was written."""
    kind, meta = manifest["kind"], manifest["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    manifest = with_applied_hash(manifest)
    live = cache.get(kind, namespace, name)
    if live is None:  # absent, or not labelled as ours (so not in the cache): look
        live = await api.get(kind, namespace=namespace, name=name)
    if live is not None and controller_uid(live) != owner.uid:
        owners = [r.get("name") for r in live["metadata"].get("ownerReferences") or []]
        raise Failure(
            Reason.NAME_CONFLICT,
            f"{kind} {name} already exists and belongs to {owners or 'nobody'}: "
            "rename this dispatcher or the queue",
        )
    if live is not None and _selector_changed(live, manifest):
        await api.delete(kind, namespace=namespace, name=name)
        cache.drop(live, kind)
        log.info(
            "%s/%s: %s %s has another selector (immutable): deleted, created again",
            namespace, owner.name, kind, name,
        )  # fmt: skip
        live = None
    if live is not None and _unchanged(live, manifest):
        return False
    cache.put(await api.apply(manifest), kind)
    log.info("%s/%s: applied %s %s", namespace, owner.name, kind, name)
    return True


async def apply_budgets(
    *, api: KubeApi, cache: Cache, spec: OutboxDispatcherSpec, owner: Owner
) -> None:
    """The enqueuer's PodDisruptionBudget, one per queue that can run several workers; and
    none for a queue that left the spec or can run only one (a drain must be able to move it)."""
    await apply_owned(api=api, cache=cache, owner=owner, manifest=build_enqueuer_pdb(owner))
    wanted = set()
    for queue in spec.queues:
        budget = build_worker_pdb(queue, owner=owner)
        if budget is not None:
            wanted.add(budget["metadata"]["name"])
            await apply_owned(api=api, cache=cache, owner=owner, manifest=budget)
    for found in cache.owned(owner, "worker", kind="PodDisruptionBudget"):
        name = found["metadata"]["name"]
        if name not in wanted:
            await api.delete("PodDisruptionBudget", namespace=owner.namespace, name=name)
            cache.drop(found, "PodDisruptionBudget")


async def migrate(
    *,
    api: KubeApi,
    cache: Cache,
    spec: OutboxDispatcherSpec,
    owner: Owner,
    migrated_image: str | None,
    defaults: WorkloadDefaults,
) -> MigrationState:
    """Where the migration of the enqueuer's image stands; creates its Job when there is none."""
    image = spec.enqueuer.image or defaults.enqueuer_image
    name = migration_job_name(owner, image)
    needed = spec.migrate and migrated_image != image
    job = cache.get("Job", owner.namespace, name) if needed else None
    if needed and job is None:
        manifest = build_migration_job(spec, owner=owner, defaults=defaults)
        try:
            job = await api.create(manifest)
        except APIConflictError:  # created by an earlier pass; the watch will show it
            raise NotYetKnown(f"Job {owner.namespace}/{name}") from None
        log.info("%s/%s: created Job %s (migrate)", owner.namespace, owner.name, name)
        cache.put(job, "Job")
    return migration_state(
        enabled=spec.migrate,
        image=image,
        migrated_image=migrated_image,
        job_name=name,
        job=job,
    )


async def drain_queues(
    *,
    api: KubeApi,
    cache: Cache,
    owner: Owner,
    draining: Mapping[str, dict[str, Any]],
    measured: Measurement | None,
    events: list[Event],
) -> dict[str, str]:
    """Keep a worker on each removed queue until its streams are empty and acked; then delete
    it (an Event in ``events``). Returns what is left, by queue."""
    left: dict[str, str] = {}
    for queue, deployment in sorted(draining.items()):
        name = deployment["metadata"]["name"]
        if measured is not None:
            entries, pending = measured.queue(queue)
            if entries == 0 and pending == 0:
                await api.delete("Deployment", namespace=owner.namespace, name=name)
                cache.drop(deployment)
                events.append(("QueueDrained", f"deleted Deployment {name}", False))
                continue
            left[queue] = f"{entries} entries, {pending} pending"
        else:
            left[queue] = "Redis unreachable, cannot tell what is left"
        if int(deployment.get("spec", {}).get("replicas") or 0) < 1:
            patched = await api.patch(
                "Deployment", namespace=owner.namespace, name=name, patch={"spec": {"replicas": 1}}
            )
            if patched is None:  # gone meanwhile: nothing left to keep running
                cache.drop(deployment)
            else:
                cache.put(patched)
    return left
