"""What a platform sets on every pod of a component: config, identity, placement.

``PodSettings`` is the part of the enqueuer's and each queue's spec that goes into their pod
templates as is (``dispatcher.controller.pods`` merges it after the operator's own settings). Its
core types (``env``, ``volumes``, ``tolerations``, ...) are the Kubernetes API's own, validated
and described by the official schemas (``dispatcher.controller.coretypes``). What the operator sets
itself is reserved: its environment, the ``/tmp`` volume and the labels its selectors use.

Those reservations are CEL rules in the CRD, so the API server refuses such a resource at
``kubectl apply``; ``PodSettings._reserved`` is their twin (same messages) for a spec that
reached the operator without them (an old CRD). The keyed lists are list-maps, as in a Pod:
``env`` and ``volumes`` by name, ``volumeMounts`` by mountPath, ``imagePullSecrets`` by name,
``topologySpreadConstraints`` by topologyKey and whenUnsatisfiable.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from dispatcher.controller.coretypes import CoreList, core_json_schema, core_validator
from dispatcher.controller.resource import API_GROUP, ResourceModel, cel_rule

__all__ = [
    "DNS_SUBDOMAIN_PATTERN",
    "MANAGED_ENV",
    "MANAGED_LABEL_PREFIXES",
    "POD_RULES",
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


_RESERVED_ENV = sorted(MANAGED_ENV)
ENV_RULE = cel_rule(
    f"!(self.name in {json.dumps(_RESERVED_ENV)})",
    f"env names {', '.join(_RESERVED_ENV)} are set by the operator",
)
TMP_VOLUME_RULE = cel_rule(
    f'self.name != "{TMP_VOLUME}"', f"volume name '{TMP_VOLUME}' is reserved (the /tmp emptyDir)"
)
TMP_MOUNT_RULE = cel_rule(
    '!self.mountPath.matches("^/tmp/*$")', "mountPath /tmp is reserved (an emptyDir)"
)
LABEL_RULE = cel_rule(
    "self.all(k, "
    + " && ".join(f'!k.startsWith("{prefix}")' for prefix in MANAGED_LABEL_PREFIXES)
    + ")",
    f"podLabels keys under {' or '.join(MANAGED_LABEL_PREFIXES)} are set by the operator",
)
MOUNT_RULE = cel_rule(
    "!has(self.volumeMounts) || self.volumeMounts.all(m, "
    "has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
    "every volumeMount must name a volume in volumes",
)
# The rules across a PodSettings' fields (a subclass with rules of its own lists these first).
POD_RULES = [MOUNT_RULE]
# A volume name is a DNS label; a mount names one. Bounds keep the rules' cost in budget.
_NAME = {"name": 63}
ENV = CoreList(name="EnvVar", max_items=128, keys=("name",), rules=(ENV_RULE,))
ENV_FROM = CoreList(name="EnvFromSource", max_items=32)
VOLUMES = CoreList(
    name="Volume", max_items=64, keys=("name",), rules=(TMP_VOLUME_RULE,), max_lengths=_NAME
)
MOUNTS = CoreList(
    name="VolumeMount",
    max_items=64,
    keys=("mountPath",),
    rules=(TMP_MOUNT_RULE,),
    max_lengths={**_NAME, "mountPath": 1024},
)
PULL_SECRETS = CoreList(name="LocalObjectReference", max_items=16, keys=("name",))
TOLERATIONS = CoreList(name="Toleration", max_items=64)
SPREAD = CoreList(
    name="TopologySpreadConstraint", max_items=16, keys=("topologyKey", "whenUnsatisfiable")
)

StringMap = Annotated[dict[str, str], Field(max_length=64)]
_Objects = list[dict[str, Any]]
EnvVars = Annotated[_Objects, ENV.validator(), ENV.json_schema()]
EnvFromSources = Annotated[_Objects, ENV_FROM.validator(), ENV_FROM.json_schema()]
Volumes = Annotated[_Objects, VOLUMES.validator(), VOLUMES.json_schema()]
VolumeMounts = Annotated[_Objects, MOUNTS.validator(), MOUNTS.json_schema()]
ObjectReferences = Annotated[_Objects, PULL_SECRETS.validator(), PULL_SECRETS.json_schema()]
Tolerations = Annotated[_Objects, TOLERATIONS.validator(), TOLERATIONS.json_schema()]
TopologySpread = Annotated[_Objects, SPREAD.validator(), SPREAD.json_schema()]
Affinity = Annotated[dict[str, Any], core_validator("Affinity"), core_json_schema("Affinity")]


class PodSettings(ResourceModel):
    """What a platform sets on every pod of a Deployment: config, identity, placement.

    Core types (``env``, ``volumes``, ``tolerations``, ...) are the Kubernetes API's own, with
    their official schemas. The operator's own environment, the ``tmp`` volume and the labels
    its selectors use are reserved.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [*POD_RULES]})

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
    pod_labels: StringMap | None = Field(
        default=None, json_schema_extra={"x-kubernetes-validations": [LABEL_RULE]}
    )

    @model_validator(mode="after")
    def _reserved(self) -> PodSettings:
        """The twin of the CEL rules above: each problem is its rule's message, and which."""
        problems = [
            f"{ENV_RULE['message']} ({e['name']})" for e in self.env if e.get("name") in MANAGED_ENV
        ]
        volumes = {v.get("name") for v in self.volumes}
        if TMP_VOLUME in volumes:
            problems.append(TMP_VOLUME_RULE["message"])
        for mount in self.volume_mounts:
            if mount.get("name") not in volumes:
                problems.append(f"{MOUNT_RULE['message']} ({mount.get('name')!r} names none)")
            if str(mount.get("mountPath", "")).rstrip("/") == "/tmp":
                problems.append(TMP_MOUNT_RULE["message"])
        problems += [
            f"{LABEL_RULE['message']} ({key})"
            for key in self.pod_labels or {}
            if key.startswith(MANAGED_LABEL_PREFIXES)
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self
