"""The ``OutboxDispatcher`` spec as frozen pydantic models.

This is the source of truth of the CRD: ``dispatcher.controller.crd`` renders the CRD's
``openAPIV3Schema`` from these models, the pod settings of ``dispatcher.controller.podsettings``
and the status of ``dispatcher.controller.conditions`` (bounds, enums, defaults and the CEL
rules in ``x-kubernetes-validations``), and a test fails if ``crds/outboxdispatchers.yaml``
drifts from it. Every CEL rule has a pydantic twin (here, or in
``dispatcher.controller.podsettings`` for the pod settings'), so a spec that slips past the API
server (an old CRD, a mock API) is still refused by the operator with the same message.

No credentials live in the spec: PostgreSQL and Redis are reached through
``secretRef: {name, key}`` to a Secret in the resource's namespace.

Read top to bottom, this module is the CRD's ``spec`` in its order; the pod
settings (``dispatcher.controller.podsettings``) and the status
(``dispatcher.controller.conditions``) are schemas of their own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dispatcher.config import STREAM_SHARDS
from dispatcher.controller.limits_spec import LimitsSpec
from dispatcher.controller.podsettings import DNS_SUBDOMAIN_PATTERN, POD_RULES, PodSettings
from dispatcher.controller.resource import ResourceModel, cel_rule
from dispatcher.options import default_of, option_of, pydantic_field
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.worker.worker_config import WorkerConfig

__all__ = [
    "AUTOSCALING_EXTERNAL",
    "DEFAULT_VERSION_TAG",
    "MAX_NAME",
    "MAX_QUEUES",
    "NAME_RULE",
    "EnqueuerSpec",
    "OutboxDispatcherSpec",
    "PostgresSpec",
    "QueueSpec",
    "RedisSpec",
    "Resources",
    "Role",
    "SecretRef",
]

DEFAULT_VERSION_TAG = "0.1.0"
AUTOSCALING_EXTERNAL = "external"

# Valid as a Redis queue name (dispatcher.stream.naming) and as a label value.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$"
HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"
# Secret names are DNS-1123 subdomains; a Secret data key.
SECRET_NAME_PATTERN = DNS_SUBDOMAIN_PATTERN
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]{1,253}$"
MAX_QUEUES = 64
MAX_RUNS: int = default_of(WorkerConfig, "max_runs")
MAX_RUNS_CONFLICT = "maxDeliveries is the old name of maxRuns: set one, or both to the same value"
# The resource name goes into Deployment names and label values (<= 63 characters).
MAX_NAME = 50
NAME_RULE = cel_rule(
    f"self.metadata.name.size() <= {MAX_NAME}",
    f"metadata.name must be at most {MAX_NAME} characters",
)

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


class SecretRef(ResourceModel):
    """A key of a Secret in the resource's namespace; the key holds a URL."""

    name: str = Field(pattern=SECRET_NAME_PATTERN, max_length=253, description="Secret name")
    key: str = Field(pattern=SECRET_KEY_PATTERN, max_length=253, description="key in the Secret")


Role = Literal["enqueuer", "worker", "operator"]


class PostgresSpec(ResourceModel):
    """Where the outbox lives: DATABASE_URL of the enqueuer (and of the migration Job)."""

    secret_ref: SecretRef
    migration_secret_ref: SecretRef | None = Field(
        default=None,
        description="DATABASE_URL of the migration Job (the tables' owner); default secretRef",
    )

    def migration(self) -> SecretRef:
        return self.migration_secret_ref or self.secret_ref


class RedisSpec(ResourceModel):
    """Where the streams live: REDIS_URL (and REDIS_CLUSTER) of every process.

    One URL for all, or one per role so each process logs in as its own ACL user; a role
    without its own reference uses ``secretRef``.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
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
    require_aof: bool = Field(
        default=False,
        description="the enqueuer and workers refuse to start unless Redis runs with "
        "appendonly yes (REQUIRE_AOF); off: they log an ERROR",
    )

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


class Resources(ResourceModel):
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
                *POD_RULES,
                cel_rule(
                    "self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas"
                ),
                cel_rule(
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
    limits: LimitsSpec | None = Field(
        default=None,
        description="limits across every worker of the queue, written to composer:limits:{<queue>}"
        " (set: the operator owns them; {}: none)",
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


class OutboxDispatcherSpec(ResourceModel):
    """The desired dispatcher: shard count, connections, enqueuer and queues."""

    shards: int = pydantic_field(
        STREAM_SHARDS,
        description="streams per queue, written to composer:stream_shards; lowering it is in "
        "force at once and the removed shards drain (condition ShardsDraining)",
    )
    postgres: PostgresSpec
    redis: RedisSpec
    enqueuer: EnqueuerSpec = Field(default_factory=EnqueuerSpec, json_schema_extra={"default": {}})
    # A list-map keyed by name: the API server refuses a duplicate name, and server-side apply
    # merges queues of several field managers by name.
    queues: list[QueueSpec] = Field(
        default_factory=list,
        max_length=MAX_QUEUES,
        json_schema_extra={
            "default": [],
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
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
