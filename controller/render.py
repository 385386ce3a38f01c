"""Pure builders of the Deployments an ``OutboxDispatcher`` owns.

No I/O: each builder takes the parsed spec, the owner's identity and the
operator's workload defaults, and returns a manifest ``dict``.
``controller.k8s`` is the one place that sends them. The pod template carries
a hash of the effective configuration and one of the values of the Secrets its
pods read, so a change of either (a Secret rotation too: ``secretKeyRef``
values are read only at pod start) rolls the pods. The shard count is not part
of it: processes read it live from Redis, so changing it restarts nothing (a
restart in the middle of a decrease is exactly when readers of the old shards
are needed). Besides the Deployments: a PodDisruptionBudget per Deployment
that can lose a pod to a drain without stopping, and the Job that runs
``dispatcher migrate`` for an enqueuer image. The spec's pod settings (env,
volumes, placement, identity) go into every pod the component runs, the
migration Job's included.

Pods follow Pod Security "restricted": non-root, no privilege escalation,
every capability dropped, RuntimeDefault seccomp, a read-only root filesystem
with an ``emptyDir`` on ``/tmp``. No fixed UID/GID unless the operator is told
one: the image's numeric ``USER`` applies, which OpenShift's restricted SCC
(that assigns its own UID range) accepts. Connection URLs come from the
referenced Secrets through ``secretKeyRef``, never inline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.model import (
    DEFAULT_VERSION_TAG,
    EnqueuerSpec,
    OutboxDispatcherSpec,
    QueueSpec,
    Resources,
    Role,
    SecretRef,
)
from controller.podsettings import PodSettings
from controller.resource import API_GROUP, API_VERSION, KIND
from dispatcher.stream.naming import fnv1a_32

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "DEFAULT_WORKLOADS",
    "METRICS_PORT",
    "QUEUE_LABEL",
    "SECRETS_HASH_ANNOTATION",
    "Owner",
    "WorkloadDefaults",
    "build_enqueuer_deployment",
    "build_enqueuer_pdb",
    "build_migration_job",
    "build_worker_deployment",
    "build_worker_pdb",
    "config_hash",
    "controller_uid",
    "enqueuer_name",
    "instance_labels",
    "migration_job_name",
    "worker_name",
    "worker_selector",
]

APP_NAME = "outbox-dispatcher"
MANAGED_BY = "outbox-dispatcher-operator"
QUEUE_LABEL = f"{API_GROUP}/queue"
CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"
SECRETS_HASH_ANNOTATION = f"{API_GROUP}/secrets-hash"
METRICS_PORT = 9090
MIGRATION_JOB_TTL = 86400  # a finished migration Job (and its pod's log) stays a day
_MAX_NAME = 63


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadDefaults:
    """What the operator fills in where a spec says nothing: its own version's images, and
    the pods' UID/GID for clusters that want fixed ones (None: the image's ``USER``)."""

    enqueuer_image: str
    worker_image: str
    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None

    def identity(self, *, pod: bool) -> dict[str, int]:
        ids = {"runAsUser": self.run_as_user, "runAsGroup": self.run_as_group}
        if pod:
            ids["fsGroup"] = self.fs_group
        return {k: v for k, v in ids.items() if v is not None}


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


DEFAULT_WORKLOADS = WorkloadDefaults(
    enqueuer_image=f"outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}",
    worker_image=f"outbox-dispatcher-worker:{DEFAULT_VERSION_TAG}",
)


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
    """The selector labels of one component of one dispatcher."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": component,
    }


def worker_selector(owner: Owner, queue: str) -> dict[str, str]:
    return {**instance_labels(owner, "worker"), QUEUE_LABEL: queue}


def _labels(selector: dict[str, str]) -> dict[str, str]:
    return {
        **selector,
        "app.kubernetes.io/part-of": APP_NAME,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def config_hash(pod_spec: dict[str, Any]) -> str:
    """A short stable digest of the pod spec: it changes iff the pods must roll."""
    canonical = json.dumps(pod_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _secret_env(name: str, ref: SecretRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _common_env(spec: OutboxDispatcherSpec, *, role: Role) -> list[dict[str, Any]]:
    return [
        _secret_env("REDIS_URL", spec.redis.secret_for(role)),
        {"name": "REDIS_CLUSTER", "value": "1" if spec.redis.cluster else "0"},
        {"name": "LOG_LEVEL", "value": spec.log_level},
        {"name": "LOG_FORMAT", "value": spec.log_format},
        {"name": "METRICS_PORT", "value": str(METRICS_PORT)},
    ]


def _resources(resources: Resources | None) -> dict[str, Any]:
    if resources is None:
        return {}
    return resources.model_dump(exclude_none=True)


def _container(
    *,
    name: str,
    image: str,
    args: list[str],
    env: list[dict[str, Any]],
    resources: Resources | None,
    defaults: WorkloadDefaults,
) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": "metrics"},
            "periodSeconds": period,
            "timeoutSeconds": 3,
            "failureThreshold": failures,
        }

    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["dispatcher"],
        "args": args,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {**probe("/healthz", 10, 3), "initialDelaySeconds": 10},
        "readinessProbe": probe("/readyz", 5, 2),
        "resources": _resources(resources),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            **defaults.identity(pod=False),
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_spec(
    container: dict[str, Any], *, grace: int, defaults: WorkloadDefaults
) -> dict[str, Any]:
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
        "securityContext": {
            "runAsNonRoot": True,
            **defaults.identity(pod=True),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }


def _with_container_settings(container: dict[str, Any], settings: PodSettings) -> dict[str, Any]:
    """The container with the spec's env, envFrom and volume mounts after the operator's own."""
    out = {**container, "env": [*container["env"], *settings.env]}
    if settings.env_from:
        out["envFrom"] = list(settings.env_from)
    out["volumeMounts"] = [*container.get("volumeMounts", []), *settings.volume_mounts]
    return out


def _with_pod_settings(pod: dict[str, Any], settings: PodSettings) -> dict[str, Any]:
    """The pod spec with the spec's identity, placement and volumes."""
    out = {**pod, "volumes": [*pod.get("volumes", []), *settings.volumes]}
    optional = {
        "serviceAccountName": settings.service_account_name,
        "imagePullSecrets": settings.image_pull_secrets,
        "nodeSelector": settings.node_selector,
        "tolerations": settings.tolerations,
        "affinity": settings.affinity,
        "topologySpreadConstraints": settings.topology_spread_constraints,
        "priorityClassName": settings.priority_class_name,
    }
    out.update({key: value for key, value in optional.items() if value})
    return out


def _startup_probe(container: dict[str, Any]) -> dict[str, Any]:
    """Up to five minutes to import handlers and reach Redis before liveness counts."""
    startup = {
        "httpGet": {"path": "/healthz", "port": "metrics"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 60,
    }
    live = {k: v for k, v in container["livenessProbe"].items() if k != "initialDelaySeconds"}
    return {**container, "startupProbe": startup, "livenessProbe": live}


def _pod_template_meta(
    labels: dict[str, str],
    pod: dict[str, Any],
    settings: PodSettings | None,
    *,
    secrets_hash: str = "",
) -> dict[str, Any]:
    extra_labels = settings.pod_labels if settings is not None else None
    annotations = {
        **((settings.pod_annotations if settings is not None else None) or {}),
        CONFIG_HASH_ANNOTATION: config_hash(pod),
    }
    if secrets_hash:
        annotations[SECRETS_HASH_ANNOTATION] = secrets_hash
    return {"labels": {**(extra_labels or {}), **labels}, "annotations": annotations}


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
    labels = _labels(selector)
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
                "metadata": _pod_template_meta(labels, pod, settings, secrets_hash=secrets_hash),
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
        _secret_env("DATABASE_URL", spec.postgres.secret_ref),
        *_common_env(spec, role="enqueuer"),
    ]
    container = _container(
        name="enqueuer",
        image=spec.enqueuer.image or defaults.enqueuer_image,
        args=_enqueuer_args(spec.enqueuer),
        env=env,
        resources=spec.enqueuer.resources,
        defaults=defaults,
    )
    container = _startup_probe(_with_container_settings(container, spec.enqueuer))
    return _deployment(
        owner=owner,
        name=enqueuer_name(owner),
        selector=instance_labels(owner, "enqueuer"),
        replicas=spec.enqueuer.replicas,
        pod=_with_pod_settings(_pod_spec(container, grace=45, defaults=defaults), spec.enqueuer),
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
    container = _container(
        name="worker",
        image=queue.image or defaults.worker_image,
        args=_worker_args(queue),
        env=_common_env(spec, role="worker"),
        resources=queue.resources,
        defaults=defaults,
    )
    container = _startup_probe(_with_container_settings(container, queue))
    return _deployment(
        owner=owner,
        name=worker_name(owner, queue.name),
        selector=worker_selector(owner, queue.name),
        replicas=replicas,
        pod=_with_pod_settings(_pod_spec(container, grace=45, defaults=defaults), queue),
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
            "labels": _labels(selector),
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


def migration_job_name(owner: Owner, image: str) -> str:
    """One Job per enqueuer image: a new image (a new schema version) migrates again."""
    digest = f"{fnv1a_32(image.encode()):08x}"
    return f"{_dns_name(f'{owner.name}-migrate')[: _MAX_NAME - 9]}-{digest}"


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
        _secret_env("DATABASE_URL", spec.postgres.migration()),
        {"name": "LOG_LEVEL", "value": spec.log_level},
        {"name": "LOG_FORMAT", "value": spec.log_format},
    ]
    container = _container(
        name="migrate",
        image=image,
        args=["migrate"],
        env=env,
        resources=enqueuer.resources,
        defaults=defaults,
    )
    for key in ("ports", "livenessProbe", "readinessProbe"):
        container.pop(key)
    container = _with_container_settings(container, enqueuer)
    pod = {
        **_with_pod_settings(_pod_spec(container, grace=30, defaults=defaults), enqueuer),
        "restartPolicy": "Never",
    }
    labels = _labels(instance_labels(owner, "migrate"))
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
            "template": {"metadata": _pod_template_meta(labels, pod, enqueuer), "spec": pod},
        },
    }
