"""Pure builders of the Deployments an ``OutboxDispatcher`` owns.

No I/O: each builder takes the parsed spec, the owner's identity and the
shard count actually published to Redis, and returns a manifest ``dict``.
``controller.k8s`` is the one place that sends them. The pod template carries
a hash of the effective configuration, so any change of it rolls the pods.

Pods follow Pod Security "restricted": non-root numeric user, no privilege
escalation, every capability dropped, RuntimeDefault seccomp, a read-only root
filesystem with an ``emptyDir`` on ``/tmp``. Connection URLs come from the
referenced Secrets through ``secretKeyRef``, never inline.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from controller.model import (
    API_GROUP,
    API_VERSION,
    KIND,
    EnqueuerSpec,
    OutboxDispatcherSpec,
    QueueSpec,
    Resources,
    SecretRef,
)
from dispatcher.stream.naming import fnv1a_32

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "METRICS_PORT",
    "QUEUE_LABEL",
    "Owner",
    "build_enqueuer_deployment",
    "build_worker_deployment",
    "config_hash",
    "enqueuer_name",
    "instance_labels",
    "worker_name",
    "worker_selector",
]

APP_NAME = "outbox-dispatcher"
MANAGED_BY = "outbox-dispatcher-operator"
QUEUE_LABEL = f"{API_GROUP}/queue"
CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"
METRICS_PORT = 9090
RUN_AS_USER = 10001
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


def _common_env(spec: OutboxDispatcherSpec, *, shards: int) -> list[dict[str, Any]]:
    return [
        _secret_env("REDIS_URL", spec.redis.secret_ref),
        {"name": "REDIS_CLUSTER", "value": "1" if spec.redis.cluster else "0"},
        {"name": "STREAM_SHARDS", "value": str(shards)},
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
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_spec(container: dict[str, Any], *, grace: int) -> dict[str, Any]:
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }


def _deployment(
    *, owner: Owner, name: str, selector: dict[str, str], replicas: int, pod: dict[str, Any]
) -> dict[str, Any]:
    labels = _labels(selector)
    return {
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
                "metadata": {
                    "labels": labels,
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash(pod)},
                },
                "spec": pod,
            },
        },
    }


def _enqueuer_args(enqueuer: EnqueuerSpec) -> list[str]:
    return [
        "enqueuer",
        f"--batch-size={enqueuer.batch_size}",
        f"--concurrency={enqueuer.concurrency}",
        f"--poll-interval={enqueuer.poll_interval:g}",
        f"--wait-replicas={enqueuer.wait_replicas}",
    ]


def build_enqueuer_deployment(
    spec: OutboxDispatcherSpec, *, owner: Owner, shards: int
) -> dict[str, Any]:
    """The enqueuer Deployment; ``shards`` is the count published to Redis."""
    env = [_secret_env("DATABASE_URL", spec.postgres.secret_ref), *_common_env(spec, shards=shards)]
    container = _container(
        name="enqueuer",
        image=spec.enqueuer.image,
        args=_enqueuer_args(spec.enqueuer),
        env=env,
        resources=spec.enqueuer.resources,
    )
    return _deployment(
        owner=owner,
        name=enqueuer_name(owner),
        selector=instance_labels(owner, "enqueuer"),
        replicas=spec.enqueuer.replicas,
        pod=_pod_spec(container, grace=45),
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
    spec: OutboxDispatcherSpec, queue: QueueSpec, *, owner: Owner, shards: int, replicas: int
) -> dict[str, Any]:
    """The worker Deployment of one queue; ``replicas`` is the autoscaler's current choice."""
    container = _container(
        name="worker",
        image=queue.image,
        args=_worker_args(queue),
        env=_common_env(spec, shards=shards),
        resources=queue.resources,
    )
    return _deployment(
        owner=owner,
        name=worker_name(owner, queue.name),
        selector=worker_selector(owner, queue.name),
        replicas=replicas,
        pod=_pod_spec(container, grace=45),
    )
