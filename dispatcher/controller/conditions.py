"""The status of an ``OutboxDispatcher``: its models and pure updates of its conditions.

Only the operator writes the status; its models ignore fields they do not know, so an
older operator still reads what a newer one wrote. The conditions:

- ``Ready``: every owned Deployment is available at its current generation,
  and PostgreSQL and Redis answer. False with the reason otherwise.
- ``Progressing``: a rollout of an owned Deployment is under way.
- ``Degraded``: something needs a human (an invalid spec, a missing Secret, an
  unreachable Redis or PostgreSQL, a Deployment name taken by another
  dispatcher, a Redis database whose shard key another dispatcher owns).
- ``ShardsDraining``: the shard count was lowered (in force at once) and
  removed shards still hold entries or pending entries; workers read them
  until they are empty.
- ``QueuesDraining``: workers of queues removed from the spec still run until
  their streams hold no entry and no pending entry.

``rollout`` reads Deployments into the names that are unavailable or rolling
out. ``lastTransitionTime`` moves only when a condition's status flips, as
Kubernetes conventions ask; every condition carries the generation it saw.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field

from dispatcher.controller.model import MAX_QUEUES
from dispatcher.controller.resource import ResourceModel

__all__ = [
    "DEGRADED",
    "PROGRESSING",
    "QUEUES_DRAINING",
    "READY",
    "SHARDS_DRAINING",
    "Condition",
    "OutboxDispatcherStatus",
    "QueueStatus",
    "Reason",
    "Rollout",
    "condition_dicts",
    "iso",
    "rollout",
    "set_condition",
]

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
QUEUES_DRAINING = "QueuesDraining"
SHARDS_DRAINING = "ShardsDraining"


class Condition(ResourceModel):
    """A standard Kubernetes condition (the metav1.Condition shape)."""

    model_config = ConfigDict(extra="ignore")

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime.datetime
    observed_generation: int | None = Field(default=None, ge=0)


class QueueStatus(ResourceModel):
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


class OutboxDispatcherStatus(ResourceModel):
    """Written by the operator only."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = None
    shards: int | None = Field(default=None, description="the shard count published to Redis")
    migrated_image: str | None = Field(
        default=None, description="the enqueuer image whose `dispatcher migrate` succeeded"
    )
    console_url: str | None = Field(
        default=None,
        max_length=2048,
        description="the web console's address (`dispatcher console`), from the resource's "
        "annotation dispatch.composer.dev/console-url (the chart sets it with console.enabled)",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    queues: list[QueueStatus] = Field(
        default_factory=list,
        max_length=MAX_QUEUES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    # At a glance (controller.glance): what `kubectl get obd` prints.
    queue_names: str | None = Field(
        default=None, description="the spec's queues, comma-separated, in the spec's order"
    )
    workers: str | None = Field(
        default=None, description="worker pods ready/wanted, over every worker Deployment"
    )
    enqueuers: str | None = Field(default=None, description="enqueuer pods ready/wanted")
    backlog: int | None = Field(
        default=None, description="entries not yet completed, summed over the queues"
    )
    pending: int | None = Field(
        default=None, description="entries delivered and not yet acked, summed over the queues"
    )

    def queue(self, name: str) -> QueueStatus | None:
        return next((q for q in self.queues if q.name == name), None)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class Reason:
    """The ``reason`` values the operator writes (CamelCase, stable: users alert on them)."""

    RECONCILED = "Reconciled"
    INVALID_SPEC = "InvalidSpec"
    SECRET_MISSING = "SecretMissing"
    REDIS_UNAVAILABLE = "RedisUnavailable"
    REMOVED_SHARDS_NOT_EMPTY = "RemovedShardsNotEmpty"
    API_ERROR = "ApiError"
    AS_EXPECTED = "AsExpected"
    POSTGRES_UNAVAILABLE = "PostgresUnavailable"
    NAME_CONFLICT = "NameConflict"
    REDIS_CONFLICT = "RedisConflict"
    DEPLOYMENTS_UNAVAILABLE = "DeploymentsUnavailable"
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    DRAINING = "Draining"
    DRAINED = "Drained"
    MIGRATING = "Migrating"
    PODS_UNSCHEDULABLE = "PodsUnschedulable"


@dataclass(frozen=True, slots=True)
class Rollout:
    """Which Deployments are not available yet, and which are still rolling out."""

    unavailable: tuple[str, ...]
    rolling: tuple[str, ...]
    # deployment -> why its Pods wait for a node (the scheduler's word), when that is why
    unschedulable: tuple[tuple[str, str], ...] = ()


def _count(status: Mapping[str, Any], key: str) -> int:
    return int(status.get(key) or 0)


def rollout(deployments: Iterable[Mapping[str, Any]]) -> Rollout:
    """Read Deployments as the Deployment controller reports them.

    Available: the controller saw the current generation and every wanted
    replica is updated and available. Rolling: it has not seen the current
    generation yet, or old-generation pods are still being replaced.
    """
    unavailable, rolling = [], []
    for deployment in deployments:
        name = str(deployment.get("metadata", {}).get("name"))
        generation = int(deployment.get("metadata", {}).get("generation") or 0)
        wanted = int(deployment.get("spec", {}).get("replicas", 1))
        status = deployment.get("status") or {}
        current = _count(status, "observedGeneration") >= generation
        updated = _count(status, "updatedReplicas") >= wanted
        if not current or not updated or _count(status, "replicas") > wanted:
            rolling.append(name)
        if not current or not updated or _count(status, "availableReplicas") < wanted:
            unavailable.append(name)
    return Rollout(unavailable=tuple(sorted(unavailable)), rolling=tuple(sorted(rolling)))


def iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Condition],
    *,
    type_: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: datetime.datetime,
    generation: int | None = None,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; the others kept in order."""
    old = next((c for c in conditions if c.type == type_), None)
    moved = old is None or old.status != status
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if moved or old is None else old.last_transition_time,
        observed_generation=generation,
    )
    kept = [c for c in conditions if c.type != type_]
    index = next((i for i, c in enumerate(conditions) if c.type == type_), len(kept))
    return [*kept[:index], new, *kept[index:]]


def condition_dicts(conditions: Sequence[Condition]) -> list[dict[str, Any]]:
    """The JSON form for a status patch."""
    return [
        {
            **c.model_dump(by_alias=True, exclude_none=True, exclude={"last_transition_time"}),
            "lastTransitionTime": iso(c.last_transition_time),
        }
        for c in conditions
    ]
