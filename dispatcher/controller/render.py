"""Pure builders of the objects an ``OutboxDispatcher`` owns: Deployments, budgets, Jobs.

No I/O: each builder takes the parsed spec, the owner's identity and the
operator's workload defaults, and returns a manifest ``dict``.
``dispatcher.controller.api_requests`` is the one place that sends them; the containers and pod
specs inside come from ``dispatcher.controller.pods``, the names and labels from
``dispatcher.controller.identity``. The shard count is not part of a pod template:
processes read it live from Redis, so changing it restarts nothing (a restart
in the middle of a decrease is exactly when readers of the old shards are
needed). Besides the Deployments: a PodDisruptionBudget per Deployment that
can lose a pod to a drain without stopping, and the Job that runs
``dispatcher migrate`` for an enqueuer image, with the enqueuer's pod settings.
"""

from __future__ import annotations

from typing import Any

from dispatcher.controller.identity import (
    Owner,
    enqueuer_name,
    instance_labels,
    migration_job_name,
    object_labels,
    worker_name,
    worker_selector,
)
from dispatcher.controller.model import EnqueuerSpec, OutboxDispatcherSpec, QueueSpec
from dispatcher.controller.pods import (
    DEFAULT_WORKLOADS,
    WorkloadDefaults,
    base_container,
    base_pod_spec,
    common_env,
    pod_template_meta,
    secret_env,
    with_container_settings,
    with_pod_settings,
    with_startup_probe,
)
from dispatcher.controller.podsettings import PodSettings

__all__ = [
    "build_enqueuer_deployment",
    "build_enqueuer_pdb",
    "build_migration_job",
    "build_worker_deployment",
    "build_worker_pdb",
]

MIGRATION_JOB_TTL = 86400  # a finished migration Job (and its pod's log) stays a day


def _deployment(
    *,
    owner: Owner,
    name: str,
    selector: dict[str, str],
    replicas: int | None,
    pod: dict[str, Any],
    secrets_hash: str,
    settings: PodSettings | None = None,
) -> dict[str, Any]:
    labels = object_labels(selector)
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": pod_template_meta(
                    labels, pod, settings=settings, secrets_hash=secrets_hash
                ),
                "spec": pod,
            },
        },
    }
    if replicas is None:  # someone else (an HPA, KEDA) owns the replica count
        del manifest["spec"]["replicas"]
    return manifest


def _enqueuer_args(enqueuer: EnqueuerSpec) -> list[str]:
    return [
        "enqueuer",
        f"--batch-size={enqueuer.batch_size}",
        f"--concurrency={enqueuer.concurrency}",
        f"--poll-interval={enqueuer.poll_interval:g}",
        f"--wait-replicas={enqueuer.wait_replicas}",
    ]


def build_enqueuer_deployment(
    spec: OutboxDispatcherSpec,
    *,
    owner: Owner,
    defaults: WorkloadDefaults = DEFAULT_WORKLOADS,
    secrets_hash: str = "",
) -> dict[str, Any]:
    """The enqueuer Deployment; ``secrets_hash`` is a digest of the values of the Secrets it
    reads (``DATABASE_URL``, ``REDIS_URL``)."""
    env = [
        secret_env("DATABASE_URL", spec.postgres.secret_ref),
        *common_env(spec, role="enqueuer"),
    ]
    container = base_container(
        name="enqueuer",
        image=spec.enqueuer.image or defaults.enqueuer_image,
        args=_enqueuer_args(spec.enqueuer),
        env=env,
        resources=spec.enqueuer.resources,
        defaults=defaults,
    )
    container = with_startup_probe(with_container_settings(container, spec.enqueuer))
    return _deployment(
        owner=owner,
        name=enqueuer_name(owner),
        selector=instance_labels(owner, "enqueuer"),
        replicas=spec.enqueuer.replicas,
        pod=with_pod_settings(base_pod_spec(container, grace=45, defaults=defaults), spec.enqueuer),
        secrets_hash=secrets_hash,
        settings=spec.enqueuer,
    )


# Every timing flag is passed, so the pods do not depend on the worker's
# defaults: the grace period fits in the pod's termination grace (45 s) with
# room to settle and exit; the lease TTL is how long the attempts of a worker
# that died wait before they run again.
WORKER_GRACE_SECONDS = 30
WORKER_LEASE_TTL_SECONDS = 30


def _worker_args(queue: QueueSpec) -> list[str]:
    return [
        "worker",
        f"--queue={queue.name}",
        f"--handler={queue.handler}",
        f"--concurrency={queue.concurrency}",
        f"--max-runs={queue.runs_limit}",
        f"--reclaim-idle={queue.reclaim_idle_seconds:g}",
        f"--handler-timeout={queue.handler_timeout_seconds:g}",
        f"--lease-ttl={WORKER_LEASE_TTL_SECONDS}",
        f"--grace-period={WORKER_GRACE_SECONDS}",
    ]


def build_worker_deployment(
    spec: OutboxDispatcherSpec,
    queue: QueueSpec,
    *,
    owner: Owner,
    replicas: int | None,
    defaults: WorkloadDefaults = DEFAULT_WORKLOADS,
    secrets_hash: str = "",
) -> dict[str, Any]:
    """The worker Deployment of one queue; ``replicas`` is the autoscaler's current choice
    (None: not ours to set), ``secrets_hash`` a digest of the ``REDIS_URL`` Secret value."""
    container = base_container(
        name="worker",
        image=queue.image or defaults.worker_image,
        args=_worker_args(queue),
        env=common_env(spec, role="worker"),
        resources=queue.resources,
        defaults=defaults,
    )
    container = with_startup_probe(with_container_settings(container, queue))
    return _deployment(
        owner=owner,
        name=worker_name(owner, queue.name),
        selector=worker_selector(owner, queue.name),
        replicas=replicas,
        pod=with_pod_settings(base_pod_spec(container, grace=45, defaults=defaults), queue),
        secrets_hash=secrets_hash,
        settings=queue,
    )


def _pdb(*, owner: Owner, name: str, selector: dict[str, str]) -> dict[str, Any]:
    """At most one pod of ``selector`` evicted at a time; crash-looping pods never block a drain."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": object_labels(selector),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_enqueuer_pdb(owner: Owner) -> dict[str, Any]:
    """The enqueuer's budget: a drain takes its replicas one at a time."""
    return _pdb(owner=owner, name=enqueuer_name(owner), selector=instance_labels(owner, "enqueuer"))


def build_worker_pdb(queue: QueueSpec, *, owner: Owner) -> dict[str, Any] | None:
    """A queue's budget, for a queue that may run more than one worker (else None)."""
    if queue.max_replicas <= 1:
        return None
    return _pdb(
        owner=owner,
        name=worker_name(owner, queue.name),
        selector=worker_selector(owner, queue.name),
    )


def build_migration_job(
    spec: OutboxDispatcherSpec, *, owner: Owner, defaults: WorkloadDefaults = DEFAULT_WORKLOADS
) -> dict[str, Any]:
    """The Job running ``dispatcher migrate`` with the enqueuer's image and pod settings.

    ``dispatcher migrate`` takes an advisory lock, so a Job overlapping another migration (or a
    manual run) waits instead of racing. A finished Job stays a day for its logs; the
    dispatcher's ``status.migratedImage`` keeps a succeeded one from running again, and a
    failed one deleted (by then, or by hand) is tried again.
    """
    enqueuer = spec.enqueuer
    image = enqueuer.image or defaults.enqueuer_image
    env = [
        secret_env("DATABASE_URL", spec.postgres.migration()),
        {"name": "LOG_LEVEL", "value": spec.log_level},
        {"name": "LOG_FORMAT", "value": spec.log_format},
    ]
    container = base_container(
        name="migrate",
        image=image,
        args=["migrate"],
        env=env,
        resources=enqueuer.resources,
        defaults=defaults,
    )
    for key in ("ports", "livenessProbe", "readinessProbe"):
        container.pop(key)
    container = with_container_settings(container, enqueuer)
    pod = {
        **with_pod_settings(base_pod_spec(container, grace=30, defaults=defaults), enqueuer),
        "restartPolicy": "Never",
    }
    labels = object_labels(instance_labels(owner, "migrate"))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": migration_job_name(owner, image),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "backoffLimit": 4,
            "activeDeadlineSeconds": 900,
            "ttlSecondsAfterFinished": MIGRATION_JOB_TTL,
            "template": {
                "metadata": pod_template_meta(labels, pod, settings=enqueuer),
                "spec": pod,
            },
        },
    }
