"""The ``OutboxDispatcher`` custom resource as frozen pydantic models.

This is the source of truth of the CRD: ``controller.crd`` renders the CRD's
``openAPIV3Schema`` from these models (bounds, enums, defaults and the CEL
rules in ``x-kubernetes-validations``), and a test fails if
``crds/outboxdispatchers.yaml`` drifts from it. Every CEL rule has a pydantic
twin here, so a spec that slips past the API server (an old CRD, a mock API)
is still refused by the operator with the same message.

No credentials live in the spec: PostgreSQL and Redis are reached through
``secretRef: {name, key}`` to a Secret in the resource's namespace.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from controller.coretypes import core_json_schema, core_validator
from dispatcher.config import STREAM_SHARDS
from dispatcher.options import option_of, pydantic_field
from dispatcher.outbox.enqueuer import EnqueuerConfig
from dispatcher.worker.config import WorkerConfig

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "AUTOSCALING_EXTERNAL",
    "DEFAULT_VERSION_TAG",
    "KIND",
    "MAX_NAME",
    "NAME_RULE",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "Condition",
    "EnqueuerSpec",
    "OutboxDispatcherSpec",
    "OutboxDispatcherStatus",
    "PodSettings",
    "PostgresSpec",
    "QueueSpec",
    "QueueStatus",
    "RedisSpec",
    "Resources",
    "Role",
    "SecretRef",
    "cel_rules",
]

API_GROUP = "dispatch.composer.dev"
API_VERSION = "v1alpha1"
KIND = "OutboxDispatcher"
PLURAL = "outboxdispatchers"
SINGULAR = "outboxdispatcher"
SHORT_NAME = "obd"
DEFAULT_VERSION_TAG = "0.1.0"
AUTOSCALING_EXTERNAL = "external"

# Valid as a Redis queue name (dispatcher.stream.naming) and as a label value.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$"
HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"
# A DNS-1123 subdomain (Secret names) and a Secret data key.
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]{1,253}$"
DNS_SUBDOMAIN_PATTERN = SECRET_NAME_PATTERN
# Environment the operator sets itself: a pod setting may not shadow it.
MANAGED_ENV = frozenset(
    {"DATABASE_URL", "REDIS_URL", "REDIS_CLUSTER", "STREAM_SHARDS", "LOG_LEVEL", "LOG_FORMAT",
     "METRICS_PORT"}
)  # fmt: skip
# The emptyDir every pod mounts on /tmp (the root filesystem is read-only).
TMP_VOLUME = "tmp"
# Label keys the operator sets on pods (its selectors rely on them).
MANAGED_LABEL_PREFIXES = ("app.kubernetes.io/", f"{API_GROUP}/")
MAX_QUEUES = 64
MAX_RUNS: int = option_of(WorkerConfig, "max_runs").default  # type: ignore[assignment]
MAX_RUNS_CONFLICT = "maxDeliveries is the old name of maxRuns: set one, or both to the same value"
# The resource name goes into Deployment names and label values (<= 63 characters).
MAX_NAME = 50
NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_NAME}",
    "message": f"metadata.name must be at most {MAX_NAME} characters",
}

Quantity = Annotated[
    int | str,
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
    ),
]


def _enqueuer(name: str, **overrides: Any) -> Any:
    """A field of the enqueuer's spec: the `dispatcher enqueuer` flag's default, bound, help."""
    return pydantic_field(option_of(EnqueuerConfig, name), **overrides)


def _worker(name: str, **overrides: Any) -> Any:
    """A field of a queue's spec: the `dispatcher worker` flag's default, bound, help."""
    return pydantic_field(option_of(WorkerConfig, name), **overrides)


def _rule(rule: str, message: str) -> dict[str, Any]:
    return {"rule": rule, "message": message}


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


class SecretRef(_Model):
    """A key of a Secret in the resource's namespace; the key holds a URL."""

    name: str = Field(pattern=SECRET_NAME_PATTERN, max_length=253, description="Secret name")
    key: str = Field(pattern=SECRET_KEY_PATTERN, max_length=253, description="key in the Secret")


Role = Literal["enqueuer", "worker", "operator"]


class PostgresSpec(_Model):
    """Where the outbox lives: DATABASE_URL of the enqueuer (and of the migration Job)."""

    secret_ref: SecretRef
    migration_secret_ref: SecretRef | None = Field(
        default=None,
        description="DATABASE_URL of the migration Job (the tables' owner); default secretRef",
    )

    def migration(self) -> SecretRef:
        return self.migration_secret_ref or self.secret_ref


class RedisSpec(_Model):
    """Where the streams live: REDIS_URL (and REDIS_CLUSTER) of every process.

    One URL for all, or one per role so each process logs in as its own ACL user; a role
    without its own reference uses ``secretRef``.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "has(self.secretRef) || (has(self.enqueuerSecretRef) && "
                    "has(self.workerSecretRef) && has(self.operatorSecretRef))",
                    "set secretRef, or all of enqueuerSecretRef, workerSecretRef and "
                    "operatorSecretRef",
                )
            ]
        }
    )

    secret_ref: SecretRef | None = Field(default=None, description="URL of every role by default")
    enqueuer_secret_ref: SecretRef | None = Field(default=None, description="URL of the enqueuer")
    worker_secret_ref: SecretRef | None = Field(default=None, description="URL of the workers")
    operator_secret_ref: SecretRef | None = Field(
        default=None, description="URL the operator uses (shard count, backlog)"
    )
    cluster: bool = Field(default=False, description="the URL points at a Redis Cluster")

    @model_validator(mode="after")
    def _every_role_has_a_url(self) -> RedisSpec:
        roles = (self.enqueuer_secret_ref, self.worker_secret_ref, self.operator_secret_ref)
        if self.secret_ref is None and any(ref is None for ref in roles):
            raise ValueError(
                "set secretRef, or all of enqueuerSecretRef, workerSecretRef and operatorSecretRef"
            )
        return self

    def secret_for(self, role: Role) -> SecretRef:
        """The Secret key holding the URL ``role`` connects with."""
        own = {
            "enqueuer": self.enqueuer_secret_ref,
            "worker": self.worker_secret_ref,
            "operator": self.operator_secret_ref,
        }[role]
        found = own or self.secret_ref
        assert found is not None  # the validator guarantees one
        return found


class Resources(_Model):
    """Container resource requests and limits (cpu, memory, ...)."""

    requests: dict[str, Quantity] | None = Field(default=None, max_length=8)
    limits: dict[str, Quantity] | None = Field(default=None, max_length=8)


IMAGE_DESCRIPTION = (
    "container image; empty means the operator's own version of it, so upgrading the "
    "operator upgrades the pods"
)


def _default_resources(memory_limit: str) -> Any:
    """Requests so pods are Burstable (not BestEffort) and fit quotas that demand requests."""
    return lambda: Resources(
        requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": memory_limit}
    )


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


class PodSettings(_Model):
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
        default=None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
        description="the pods' ServiceAccount (workload identity); its token is not mounted",
    )  # fmt: skip
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


class EnqueuerSpec(PodSettings):
    """The enqueuer Deployment: `dispatcher enqueuer`."""

    image: str | None = Field(
        default=None, min_length=1, max_length=512, description=IMAGE_DESCRIPTION
    )
    replicas: int = Field(default=1, ge=0, le=32)
    batch_size: int = _enqueuer("batch_size", le=10000)
    concurrency: int = _enqueuer("concurrency", le=256)
    poll_interval: float = _enqueuer("poll_interval", le=3600)
    wait_replicas: int = _enqueuer("wait_replicas", le=16)
    resources: Resources = Field(
        default_factory=_default_resources("256Mi"),
        description="default: requests cpu 100m, memory 128Mi; limits memory 256Mi; {} for none",
    )


class QueueSpec(PodSettings):
    """One queue and its worker Deployment (`dispatcher worker`), autoscaled on backlog."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule("self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas"),
                _rule(
                    "!has(self.maxRuns) || !has(self.maxDeliveries) || "
                    "self.maxRuns == self.maxDeliveries",
                    MAX_RUNS_CONFLICT,
                ),
            ]
        }
    )

    name: str = Field(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=63)
    image: str | None = Field(
        default=None, min_length=1, max_length=512, description=IMAGE_DESCRIPTION
    )
    handler: str = Field(pattern=HANDLER_PATTERN, max_length=512, description="module:function")
    concurrency: int = _worker("concurrency", le=1024)
    # No schema default: an old resource sets only maxDeliveries, and a
    # defaulted maxRuns would then contradict it.
    max_runs: int | None = _worker(
        "max_runs",
        default=None,
        le=1000,
        description="handler runs of one task attempt, then it is dead-lettered "
        f"(default {MAX_RUNS})",
    )
    max_deliveries: int | None = _worker(
        "max_runs", default=None, le=1000, description="the old name of maxRuns, same meaning"
    )
    # A deployed worker waits at least a second before it reclaims (the CLI takes less
    # for tests).
    reclaim_idle_seconds: float = _worker("reclaim_idle", ge=1, le=86400)
    handler_timeout_seconds: float = _worker("handler_timeout", le=86400)
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=10, ge=1, le=1000)
    target_backlog_per_replica: int = Field(default=100, ge=1, le=1_000_000)
    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=86400)
    autoscaling: Literal["builtin", "external"] = Field(
        default="builtin",
        description="builtin: the operator sets replicas from the backlog; external: an HPA or "
        "KEDA ScaledObject you own does, and the operator leaves replicas alone",
    )
    resources: Resources = Field(
        default_factory=_default_resources("512Mi"),
        description="default: requests cpu 100m, memory 128Mi; limits memory 512Mi; {} for none",
    )

    @model_validator(mode="after")
    def _replica_bounds(self) -> QueueSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        return self

    @model_validator(mode="after")
    def _one_run_limit(self) -> QueueSpec:
        both = self.max_runs is not None and self.max_deliveries is not None
        if both and self.max_runs != self.max_deliveries:
            raise ValueError(MAX_RUNS_CONFLICT)
        return self

    @property
    def runs_limit(self) -> int:
        """``maxRuns``, or the old ``maxDeliveries``, or the default."""
        return self.max_runs or self.max_deliveries or MAX_RUNS


class OutboxDispatcherSpec(_Model):
    """The desired dispatcher: shard count, connections, enqueuer and queues."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.queues) || "
                    "self.queues.all(q, self.queues.exists_one(p, p.name == q.name))",
                    "queue names must be unique",
                )
            ]
        }
    )

    shards: int = pydantic_field(
        STREAM_SHARDS,
        description="streams per queue, written to composer:stream_shards; lowering it is in "
        "force at once and the removed shards drain (condition ShardsDraining)",
    )
    postgres: PostgresSpec
    redis: RedisSpec
    enqueuer: EnqueuerSpec = Field(default_factory=EnqueuerSpec, json_schema_extra={"default": {}})
    queues: list[QueueSpec] = Field(
        default_factory=list, max_length=MAX_QUEUES, json_schema_extra={"default": []}
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    migrate: bool = Field(
        default=True,
        description="run `dispatcher migrate` (a Job per enqueuer image) before the enqueuer",
    )

    @model_validator(mode="after")
    def _unique_queues(self) -> OutboxDispatcherSpec:
        names = [q.name for q in self.queues]
        if len(names) != len(set(names)):
            raise ValueError("queue names must be unique")
        return self

    def queue(self, name: str) -> QueueSpec | None:
        return next((q for q in self.queues if q.name == name), None)


class Condition(_Model):
    """A standard Kubernetes condition (the metav1.Condition shape)."""

    model_config = ConfigDict(extra="ignore")

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime.datetime
    observed_generation: int | None = Field(default=None, ge=0)


class QueueStatus(_Model):
    """What the autoscaler saw and did for one queue."""

    model_config = ConfigDict(extra="ignore")

    name: str
    backlog: int | None = Field(default=None, description="entries not yet completed")
    pending: int | None = Field(default=None, description="delivered, not yet acked")
    replicas: int | None = None
    desired_replicas: int | None = None
    last_scale_time: datetime.datetime | None = None
    scale_down_since: datetime.datetime | None = Field(
        default=None, description="since when fewer replicas would do (stabilization)"
    )
    scale_down_to: int | None = Field(
        default=None, description="the highest recommendation within the window"
    )


class OutboxDispatcherStatus(_Model):
    """Written by the operator only."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = None
    shards: int | None = Field(default=None, description="the shard count published to Redis")
    migrated_image: str | None = Field(
        default=None, description="the enqueuer image whose `dispatcher migrate` succeeded"
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    queues: list[QueueStatus] = Field(default_factory=list, max_length=MAX_QUEUES)

    def queue(self, name: str) -> QueueStatus | None:
        return next((q for q in self.queues if q.name == name), None)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def cel_rules() -> list[tuple[str, dict[str, str]]]:
    """Every CEL rule with its JSON path in the spec (for tests and docs)."""
    found: list[tuple[str, dict[str, str]]] = [("", NAME_RULE)]
    for path, model in (
        ("spec", OutboxDispatcherSpec),
        ("spec.redis", RedisSpec),
        ("spec.queues[*]", QueueSpec),
    ):
        extra: Any = model.model_config.get("json_schema_extra") or {}
        found.extend((path, rule) for rule in extra.get("x-kubernetes-validations", []))
    return found
