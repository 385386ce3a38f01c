"""Status conditions of an ``OutboxDispatcher``: pure updates of the condition list.

Three condition types: ``Ready`` (the workloads are applied and Redis
answers), ``Degraded`` (something needs a human: an invalid spec, a missing
Secret, an unreachable Redis) and ``ShardsDraining`` (after the shard count
was lowered, the removed shards that still hold entries or pending entries;
false once they are all empty).
``lastTransitionTime`` moves only when a condition's status flips, as
Kubernetes conventions ask.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, Literal

from controller.model import Condition

__all__ = [
    "DEGRADED",
    "READY",
    "SHARDS_DRAINING",
    "Reason",
    "condition_dicts",
    "iso",
    "set_condition",
]

READY = "Ready"
DEGRADED = "Degraded"
SHARDS_DRAINING = "ShardsDraining"


class Reason:
    """The ``reason`` values the operator writes (CamelCase, stable: users alert on them)."""

    RECONCILED = "Reconciled"
    INVALID_SPEC = "InvalidSpec"
    SECRET_MISSING = "SecretMissing"
    REDIS_UNAVAILABLE = "RedisUnavailable"
    REMOVED_SHARDS_NOT_EMPTY = "RemovedShardsNotEmpty"
    API_ERROR = "ApiError"
    AS_EXPECTED = "AsExpected"


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
