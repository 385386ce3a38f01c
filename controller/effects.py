"""The writes one pass makes to the Kubernetes API besides the status.

Each function is one kind of object: a Deployment created or merge-patched only when it
differs from the live one (the watch cache's copy, updated with every answer), the
PodDisruptionBudgets, the migration Job, and the worker Deployments of removed queues kept
at one replica until their streams are empty, then deleted. Problems a user can fix raise
``Failure``; an object the watch has not shown yet raises ``NotYetKnown``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from controller.cache import Cache
from controller.conditions import Reason
from controller.identity import Owner, controller_uid, instance_labels, migration_job_name
from controller.k8s import APIConflictError, KubeApi, contains
from controller.migration import MigrationState, migration_state
from controller.model import OutboxDispatcherSpec
from controller.pods import WorkloadDefaults
from controller.redis_access import Measurement
from controller.render import build_enqueuer_pdb, build_migration_job, build_worker_pdb
from controller.report import Failure

__all__ = ["NotYetKnown", "apply_budgets", "apply_deployment", "drain_queues", "migrate"]

log = logging.getLogger("controller")
Event = tuple[str, str, bool]  # reason, message, warning


class NotYetKnown(Exception):
    """An object exists that the watch cache has not seen yet: try again shortly."""


async def apply_deployment(
    *, api: KubeApi, cache: Cache, owner: Owner, manifest: dict[str, Any]
) -> None:
    """Create or merge-patch one Deployment, only if it differs from what is live."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    live = cache.deployments.get((namespace, name))
    if live is None:
        try:
            cache.put(await api.create_deployment(manifest))
        except APIConflictError:
            # It exists but the watch has not shown it yet: the next pass knows whose it is.
            raise NotYetKnown(f"Deployment {namespace}/{name}") from None
        log.info("%s/%s: created Deployment %s", namespace, owner.name, name)
        return
    if controller_uid(live) != owner.uid:
        owners = [r.get("name") for r in live["metadata"].get("ownerReferences") or []]
        raise Failure(
            Reason.NAME_CONFLICT,
            f"Deployment {name} already exists and belongs to {owners or 'nobody'}: "
            "rename this dispatcher or the queue",
        )
    if contains(live, manifest):
        return
    cache.put(await api.patch_deployment(namespace=namespace, name=name, patch=manifest))
    log.info("%s/%s: updated Deployment %s", namespace, owner.name, name)


async def apply_budgets(*, api: KubeApi, spec: OutboxDispatcherSpec, owner: Owner) -> None:
    """The enqueuer's PodDisruptionBudget, one per queue that can run several workers; and
    none for a queue that left the spec or can run only one (a drain must be able to move it)."""
    await api.apply_object(build_enqueuer_pdb(owner))
    wanted = set()
    for queue in spec.queues:
        budget = build_worker_pdb(queue, owner=owner)
        if budget is not None:
            wanted.add(budget["metadata"]["name"])
            await api.apply_object(budget)
    for found in await api.list_objects(
        "PodDisruptionBudget", namespace=owner.namespace, selector=instance_labels(owner, "worker")
    ):
        meta = found.get("metadata", {})
        if controller_uid(found) == owner.uid and meta.get("name") not in wanted:
            await api.delete_object(
                "PodDisruptionBudget", namespace=owner.namespace, name=meta["name"]
            )


async def migrate(
    *,
    api: KubeApi,
    spec: OutboxDispatcherSpec,
    owner: Owner,
    migrated_image: str | None,
    defaults: WorkloadDefaults,
) -> MigrationState:
    """Where the migration of the enqueuer's image stands; creates its Job when there is none."""
    image = spec.enqueuer.image or defaults.enqueuer_image
    name = migration_job_name(owner, image)
    needed = spec.migrate and migrated_image != image
    job = await api.get_object("Job", namespace=owner.namespace, name=name) if needed else None
    if needed and job is None:
        job = await api.create_object(build_migration_job(spec, owner=owner, defaults=defaults))
        log.info("%s/%s: created Job %s (dispatcher migrate)", owner.namespace, owner.name, name)
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
                await api.delete_deployment(namespace=owner.namespace, name=name)
                cache.drop(deployment)
                events.append(("QueueDrained", f"deleted Deployment {name}", False))
                continue
            left[queue] = f"{entries} entries, {pending} pending"
        else:
            left[queue] = "Redis unreachable, cannot tell what is left"
        if int(deployment.get("spec", {}).get("replicas") or 0) < 1:
            patched = await api.patch_deployment(
                namespace=owner.namespace, name=name, patch={"spec": {"replicas": 1}}
            )
            cache.put(patched)
    return left
