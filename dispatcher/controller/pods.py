"""Pure builders of the operator's containers and pod specs, before and after the spec's settings.

Pods follow Pod Security "restricted": non-root, no privilege escalation,
every capability dropped, RuntimeDefault seccomp, a read-only root filesystem
with an ``emptyDir`` on ``/tmp``. No fixed UID/GID unless the operator is told
one: the image's numeric ``USER`` applies, which OpenShift's restricted SCC
(that assigns its own UID range) accepts. Connection URLs come from the
referenced Secrets through ``secretKeyRef``, never inline. The spec's pod
settings (env, volumes, placement, identity) are merged after the operator's
own. The pod template's annotations carry a hash of the pod spec and one of the
values of the Secrets its pods read, so a change of either rolls the pods.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dispatcher.controller.model import (
    DEFAULT_VERSION_TAG,
    OutboxDispatcherSpec,
    Resources,
    Role,
    SecretRef,
)
from dispatcher.controller.podsettings import PodSettings
from dispatcher.controller.resource import API_GROUP

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "DEFAULT_WORKLOADS",
    "METRICS_PORT",
    "SECRETS_HASH_ANNOTATION",
    "WorkloadDefaults",
    "base_container",
    "base_pod_spec",
    "common_env",
    "config_hash",
    "pod_template_meta",
    "secret_env",
    "with_container_settings",
    "with_pod_settings",
    "with_startup_probe",
]

CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"
SECRETS_HASH_ANNOTATION = f"{API_GROUP}/secrets-hash"
METRICS_PORT = 9090


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


DEFAULT_WORKLOADS = WorkloadDefaults(
    enqueuer_image=f"outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}",
    worker_image=f"outbox-dispatcher-worker:{DEFAULT_VERSION_TAG}",
)


def config_hash(pod_spec: dict[str, Any]) -> str:
    """A short stable digest of the pod spec: it changes iff the pods must roll."""
    canonical = json.dumps(pod_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def secret_env(name: str, ref: SecretRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def common_env(spec: OutboxDispatcherSpec, *, role: Role) -> list[dict[str, Any]]:
    return [
        secret_env("REDIS_URL", spec.redis.secret_for(role)),
        {"name": "REDIS_CLUSTER", "value": "1" if spec.redis.cluster else "0"},
        {"name": "REQUIRE_AOF", "value": "1" if spec.redis.require_aof else "0"},
        {"name": "LOG_LEVEL", "value": spec.log_level},
        {"name": "LOG_FORMAT", "value": spec.log_format},
        {"name": "METRICS_PORT", "value": str(METRICS_PORT)},
    ]


def _resources(resources: Resources | None) -> dict[str, Any]:
    if resources is None:
        return {}
    return resources.model_dump(exclude_none=True)


def base_container(
    *,
    name: str,
    image: str,
    args: list[str],
    env: list[dict[str, Any]],
    resources: Resources | None,
    defaults: WorkloadDefaults,
) -> dict[str, Any]:
    def probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
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
        "livenessProbe": {**probe("/healthz", period=10, failures=3), "initialDelaySeconds": 10},
        "readinessProbe": probe("/readyz", period=5, failures=2),
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


def base_pod_spec(
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


def with_container_settings(container: dict[str, Any], settings: PodSettings) -> dict[str, Any]:
    """The container with the spec's env, envFrom and volume mounts after the operator's own."""
    out = {**container, "env": [*container["env"], *settings.env]}
    if settings.env_from:
        out["envFrom"] = list(settings.env_from)
    out["volumeMounts"] = [*container.get("volumeMounts", []), *settings.volume_mounts]
    return out


def with_pod_settings(pod: dict[str, Any], settings: PodSettings) -> dict[str, Any]:
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


def with_startup_probe(container: dict[str, Any]) -> dict[str, Any]:
    """Up to five minutes to import handlers and reach Redis before liveness counts."""
    startup = {
        "httpGet": {"path": "/healthz", "port": "metrics"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 60,
    }
    live = {k: v for k, v in container["livenessProbe"].items() if k != "initialDelaySeconds"}
    return {**container, "startupProbe": startup, "livenessProbe": live}


def pod_template_meta(
    labels: dict[str, str],
    pod: dict[str, Any],
    *,
    settings: PodSettings | None,
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
