"""What a platform sets on every pod of a component: config, identity, placement.

``PodSettings`` is the part of the enqueuer's and each queue's spec that goes into their pod
templates as is (``controller.pods`` merges it after the operator's own settings). Its
core types (``env``, ``volumes``, ``tolerations``, ...) are the Kubernetes API's own, validated
and described by the official schemas (``controller.coretypes``). What the operator sets
itself is reserved: its environment, the ``/tmp`` volume and the labels its selectors use.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from controller.coretypes import core_json_schema, core_validator
from controller.resource import API_GROUP, ResourceModel

__all__ = [
    "DNS_SUBDOMAIN_PATTERN",
    "MANAGED_ENV",
    "MANAGED_LABEL_PREFIXES",
    "TMP_VOLUME",
    "PodSettings",
]

# A DNS-1123 subdomain (ServiceAccount, PriorityClass and Secret names).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# Environment the operator sets itself: a pod setting may not shadow it.
MANAGED_ENV = frozenset(
    {
        "DATABASE_URL",
        "REDIS_URL",
        "REDIS_CLUSTER",
        "REQUIRE_AOF",
        "STREAM_SHARDS",
        "LOG_LEVEL",
        "LOG_FORMAT",
        "METRICS_PORT",
    }
)
# The emptyDir every pod mounts on /tmp (the root filesystem is read-only).
TMP_VOLUME = "tmp"
# Label keys the operator sets on pods (its selectors rely on them).
MANAGED_LABEL_PREFIXES = ("app.kubernetes.io/", f"{API_GROUP}/")


StringMap = Annotated[dict[str, str], Field(max_length=64)]
_Objects = list[dict[str, Any]]
EnvVars = Annotated[
    _Objects, core_validator("EnvVar", many=True), core_json_schema("EnvVar", many=True)
]
EnvFromSources = Annotated[
    _Objects,
    core_validator("EnvFromSource", many=True),
    core_json_schema("EnvFromSource", many=True),
]
Volumes = Annotated[
    _Objects, core_validator("Volume", many=True), core_json_schema("Volume", many=True)
]
VolumeMounts = Annotated[
    _Objects, core_validator("VolumeMount", many=True), core_json_schema("VolumeMount", many=True)
]
ObjectReferences = Annotated[
    _Objects,
    core_validator("LocalObjectReference", many=True),
    core_json_schema("LocalObjectReference", many=True),
]
Tolerations = Annotated[
    _Objects, core_validator("Toleration", many=True), core_json_schema("Toleration", many=True)
]
TopologySpread = Annotated[
    _Objects,
    core_validator("TopologySpreadConstraint", many=True),
    core_json_schema("TopologySpreadConstraint", many=True),
]
Affinity = Annotated[
    dict[str, Any], core_validator("Affinity", many=False), core_json_schema("Affinity", many=False)
]


class PodSettings(ResourceModel):
    """What a platform sets on every pod of a Deployment: config, identity, placement.

    Core types (``env``, ``volumes``, ``tolerations``, ...) are the Kubernetes API's own, with
    their official schemas. The operator's own environment, the ``tmp`` volume and the labels
    its selectors use are reserved.
    """

    env: EnvVars = Field(default_factory=list)
    env_from: EnvFromSources = Field(default_factory=list)
    volumes: Volumes = Field(default_factory=list)
    volume_mounts: VolumeMounts = Field(default_factory=list)
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="the pods' ServiceAccount (workload identity); its token is not mounted",
    )
    image_pull_secrets: ObjectReferences = Field(default_factory=list)
    node_selector: StringMap | None = None
    tolerations: Tolerations = Field(default_factory=list)
    affinity: Affinity | None = None
    topology_spread_constraints: TopologySpread = Field(default_factory=list)
    priority_class_name: str | None = Field(
        default=None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253
    )
    pod_annotations: StringMap | None = None
    pod_labels: StringMap | None = None

    @model_validator(mode="after")
    def _reserved(self) -> PodSettings:
        problems = [
            f"env {e['name']} is set by the operator"
            for e in self.env
            if e.get("name") in MANAGED_ENV
        ]
        volumes = {v.get("name") for v in self.volumes}
        if TMP_VOLUME in volumes:
            problems.append(f"volume name {TMP_VOLUME!r} is reserved (the /tmp emptyDir)")
        for mount in self.volume_mounts:
            if mount.get("name") not in volumes:
                problems.append(f"volumeMount {mount.get('name')!r} names no volume in volumes")
            if str(mount.get("mountPath", "")).rstrip("/") == "/tmp":
                problems.append("mountPath /tmp is reserved (an emptyDir)")
        for key in self.pod_labels or {}:
            if key.startswith(MANAGED_LABEL_PREFIXES):
                problems.append(f"pod label {key} is set by the operator")
        if problems:
            raise ValueError("; ".join(problems))
        return self
