"""What one pass over a dispatcher found and did (``Pass``), and the status made of it.

Pure: ``status_after`` turns a pass into the whole status to write, ``conditions`` into the
conditions (see ``dispatcher.controller.conditions`` for what each means), and
``degraded_events`` into the Warning Events worth posting. What a pass could not measure
keeps its last value.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.controller.conditions import (
    DEGRADED,
    PROGRESSING,
    QUEUES_DRAINING,
    READY,
    SHARDS_DRAINING,
    OutboxDispatcherStatus,
    Reason,
    Rollout,
    condition_dicts,
    set_condition,
)
from dispatcher.controller.glance import GLANCE_FIELDS
from dispatcher.controller.migration import MIGRATED, MigrationState
from dispatcher.controller.shard_policy import ShardDecision

__all__ = [
    "CONSOLE_URL_ANNOTATION",
    "Failure",
    "Pass",
    "Verdict",
    "conditions",
    "console_url",
    "degraded_events",
    "status_after",
    "verdicts",
]

# Set by the chart when it runs the console (console.enabled); copied into status.consoleUrl.
CONSOLE_URL_ANNOTATION = "dispatch.composer.dev/console-url"


_GLANCE = {
    name: True
    for name, info in OutboxDispatcherStatus.model_fields.items()
    if info.alias in GLANCE_FIELDS
}


class Failure(Exception):
    """A problem a user can fix, with the condition reason it is reported under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, kw_only=True)
class Pass:
    """What one pass found and did."""

    problem: Failure | None = None
    decision: ShardDecision | None = None
    shards: int | None = None
    queues: list[dict[str, Any]] = field(default_factory=list)
    rollout: Rollout = field(default_factory=lambda: Rollout(unavailable=(), rolling=()))
    draining: dict[str, str] = field(default_factory=dict)  # queue -> what is left
    events: list[tuple[str, str, bool]] = field(default_factory=list)  # reason, message, warning
    migration: MigrationState | None = None
    applied: bool = False  # the Deployments were applied (the pass got that far)
    measured: bool = False  # Redis answered the backlog measurement
    scaled: list[str] = field(default_factory=list)  # "up"/"down", one per rescaled queue
    glance: dict[str, Any] = field(default_factory=dict)  # controller.glance's fields


@dataclass(frozen=True, slots=True)
class Verdict:
    """One condition as a pass decides it."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


def _flag(type_: str, value: bool, *, reason: str, message: str = "") -> Verdict:
    return Verdict(type_, "True" if value else "False", reason, message)


def _ready(result: Pass) -> Verdict:
    problem, migration, rollout = result.problem, result.migration, result.rollout
    if problem is not None:
        return _flag(READY, False, reason=problem.reason, message=problem.message)
    if migration is not None and not migration.done:
        return _flag(READY, False, reason=Reason.MIGRATING, message=migration.condition()[2])
    if rollout.unschedulable:
        why = "; ".join(f"{name}: {message}" for name, message in rollout.unschedulable)
        return _flag(READY, False, reason=Reason.PODS_UNSCHEDULABLE, message=why)
    if rollout.unavailable:
        waiting = ", ".join(rollout.unavailable)
        return _flag(
            READY,
            False,
            reason=Reason.DEPLOYMENTS_UNAVAILABLE,
            message=f"not available yet: {waiting}",
        )
    shards = "" if result.decision is None else f"; {result.decision.message}"
    return _flag(
        READY, True, reason=Reason.RECONCILED, message=f"every Deployment is available{shards}"
    )


def _progressing(rollout: Rollout) -> Verdict:
    if rollout.rolling:
        rolling = ", ".join(rollout.rolling)
        return _flag(
            PROGRESSING, True, reason=Reason.ROLLING_OUT, message=f"rolling out: {rolling}"
        )
    return _flag(PROGRESSING, False, reason=Reason.ROLLOUT_COMPLETE)


def _degraded(problem: Failure | None) -> Verdict:
    if problem is not None:
        return _flag(DEGRADED, True, reason=problem.reason, message=problem.message)
    return _flag(DEGRADED, False, reason=Reason.AS_EXPECTED)


def verdicts(result: Pass) -> list[Verdict]:
    """The conditions a pass decides, in the order a new status lists them."""
    found = [_ready(result), _progressing(result.rollout), _degraded(result.problem)]
    decision = result.decision
    if decision is not None:  # measured: what is left on removed shards is known
        reason = Reason.REMOVED_SHARDS_NOT_EMPTY if decision.draining else Reason.AS_EXPECTED
        draining = bool(decision.draining)
        found.append(
            _flag(SHARDS_DRAINING, draining, reason=reason, message=decision.draining_message)
        )
    if result.draining:
        left = "; ".join(f"{q}: {what}" for q, what in sorted(result.draining.items()))
        message = f"removed queues still hold work: {left}"
        found.append(_flag(QUEUES_DRAINING, True, reason=Reason.DRAINING, message=message))
    elif result.problem is None:
        found.append(_flag(QUEUES_DRAINING, False, reason=Reason.DRAINED))
    if result.migration is not None:
        found.append(Verdict(MIGRATED, *result.migration.condition()))
    return found


def conditions(
    status: OutboxDispatcherStatus,
    result: Pass,
    *,
    now: datetime.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The conditions after a pass, in their JSON form."""
    found = status.conditions
    for verdict in verdicts(result):
        found = set_condition(
            found,
            type_=verdict.type,
            status=verdict.status,
            reason=verdict.reason,
            message=verdict.message,
            now=now,
            generation=generation,
        )
    return condition_dicts(found)


def console_url(meta: Mapping[str, Any]) -> str | None:
    """The console's address the resource's annotation names; None unless an http(s) URL."""
    url = (meta.get("annotations") or {}).get(CONSOLE_URL_ANNOTATION)
    if not isinstance(url, str) or len(url) > 2048:
        return None
    return url if url.startswith(("http://", "https://")) else None


def status_after(
    status: OutboxDispatcherStatus,
    result: Pass,
    *,
    now: datetime.datetime,
    generation: int | None,
    console: str | None = None,
) -> dict[str, Any]:
    """The whole status after a pass: what it could not measure keeps its last value."""
    written: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions(status, result, now=now, generation=generation),
    }
    if console is not None:
        written["consoleUrl"] = console
    shards = result.shards if result.shards is not None else status.shards
    if shards is not None:
        written["shards"] = shards
    if result.queues or result.problem is None:
        written["queues"] = result.queues
    # What this pass could not tell (an unmeasured backlog) keeps its last value.
    written.update(status.model_dump(by_alias=True, include=_GLANCE, exclude_none=True))
    written.update(result.glance)
    migration = result.migration
    if migration is not None and migration.phase == "succeeded":
        written["migratedImage"] = migration.image
    elif status.migrated_image is not None:
        written["migratedImage"] = status.migrated_image
    return written


def degraded_events(
    status: OutboxDispatcherStatus, after: Mapping[str, Any]
) -> list[tuple[str, str, bool]]:
    """A Warning Event when ``Degraded`` turns true or changes reason (not on every retry)."""
    old = status.condition(DEGRADED)
    new = next((c for c in after["conditions"] if c["type"] == DEGRADED), None)
    if new is None or new["status"] != "True":
        return []
    if old is not None and old.status == "True" and old.reason == new["reason"]:
        return []
    return [(new["reason"], new.get("message", ""), True)]
