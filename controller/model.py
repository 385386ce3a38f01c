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

from dispatcher.stream.naming import DEFAULT_SHARDS

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
    "PostgresSpec",
    "QueueSpec",
    "QueueStatus",
    "RedisSpec",
    "Resources",
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
MAX_QUEUES = 64
MAX_RUNS = 5
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


class PostgresSpec(_Model):
    """Where the outbox lives: DATABASE_URL of the enqueuer."""

    secret_ref: SecretRef


class RedisSpec(_Model):
    """Where the streams live: REDIS_URL (and REDIS_CLUSTER) of every process."""

    secret_ref: SecretRef
    cluster: bool = Field(default=False, description="the URL points at a Redis Cluster")


class Resources(_Model):
    """Container resource requests and limits (cpu, memory, ...)."""

    requests: dict[str, Quantity] | None = Field(default=None, max_length=8)
    limits: dict[str, Quantity] | None = Field(default=None, max_length=8)


IMAGE_DESCRIPTION = (
    "container image; empty means the operator's own version of it, so upgrading the "
    "operator upgrades the pods"
)


class EnqueuerSpec(_Model):
    """The enqueuer Deployment: `dispatcher enqueuer`."""

    image: str | None = Field(
        default=None, min_length=1, max_length=512, description=IMAGE_DESCRIPTION
    )
    replicas: int = Field(default=1, ge=0, le=32)
    batch_size: int = Field(default=100, ge=1, le=10000, description="rows per claim")
    concurrency: int = Field(default=4, ge=1, le=256, description="batches in flight")
    poll_interval: float = Field(default=1.0, ge=0.01, le=3600, description="seconds")
    wait_replicas: int = Field(default=0, ge=0, le=16, description="Redis WAIT replicas")
    resources: Resources | None = None


class QueueSpec(_Model):
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
    concurrency: int = Field(default=8, ge=1, le=1024, description="handlers at once per pod")
    # No schema default: an old resource sets only maxDeliveries, and a
    # defaulted maxRuns would then contradict it.
    max_runs: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=f"handler runs of one task attempt, then dead-letter (default {MAX_RUNS})",
    )
    max_deliveries: int | None = Field(
        default=None, ge=1, le=1000, description="the old name of maxRuns, same meaning"
    )
    reclaim_idle_seconds: float = Field(default=30.0, ge=1, le=86400)
    handler_timeout_seconds: float = Field(
        default=0, ge=0, le=86400, description="seconds a run may take, then it fails; 0 = none"
    )
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=10, ge=1, le=1000)
    target_backlog_per_replica: int = Field(default=100, ge=1, le=1_000_000)
    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=86400)
    autoscaling: Literal["builtin", "external"] = Field(
        default="builtin",
        description="builtin: the operator sets replicas from the backlog; external: an HPA or "
        "KEDA ScaledObject you own does, and the operator leaves replicas alone",
    )
    resources: Resources | None = None

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

    shards: int = Field(
        default=DEFAULT_SHARDS,
        ge=1,
        le=4096,
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
    for path, model in (("spec", OutboxDispatcherSpec), ("spec.queues[*]", QueueSpec)):
        extra: Any = model.model_config.get("json_schema_extra") or {}
        found.extend((path, rule) for rule in extra.get("x-kubernetes-validations", []))
    return found
