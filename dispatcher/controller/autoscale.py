"""The autoscaler's step for one queue: pure, from what was measured to what to render.

``autoscale_queue`` turns the live replica count, the measured backlog and the
window state kept in the status into the replicas to render and the queue's
status row. With ``autoscaling: external`` it renders no replica count at all
(an HPA or KEDA owns it) and only reports the backlog.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from dispatcher.controller.conditions import QueueStatus, iso
from dispatcher.controller.model import AUTOSCALING_EXTERNAL, QueueSpec
from dispatcher.controller.scaling import ScalePolicy, ScaleState, clamp, decide

__all__ = ["ScaleStep", "autoscale_queue", "policy"]


@dataclass(frozen=True, slots=True)
class ScaleStep:
    replicas: int | None  # None: not ours to set
    row: dict[str, Any]  # the queue's entry in status.queues
    event: str | None = None  # what changed, for a Scaled Event


def policy(queue: QueueSpec) -> ScalePolicy:
    return ScalePolicy(
        min_replicas=queue.min_replicas,
        max_replicas=queue.max_replicas,
        target_backlog_per_replica=queue.target_backlog_per_replica,
        stabilization_seconds=queue.scale_down_stabilization_seconds,
    )


def autoscale_queue(
    queue: QueueSpec,
    *,
    live_replicas: int | None,
    measured: tuple[int, int] | None,
    before: QueueStatus | None,
    now: datetime.datetime,
) -> ScaleStep:
    """``live_replicas`` None: no Deployment yet; ``measured`` None: Redis did not answer."""
    backlog, pending = measured if measured is not None else (None, None)
    before = before or QueueStatus(name=queue.name)
    if queue.autoscaling == AUTOSCALING_EXTERNAL:
        row = QueueStatus(name=queue.name, backlog=backlog, pending=pending, replicas=live_replicas)
        return ScaleStep(replicas=None, row=_row(row))
    bounds = policy(queue)
    # A new Deployment starts at the bottom of its range.
    current = bounds.min_replicas if live_replicas is None else int(live_replicas)
    since = before.scale_down_since
    decision = decide(
        current=current,
        backlog=backlog,
        policy=bounds,
        state=ScaleState(
            down_since=None if since is None else since.timestamp(), down_to=before.scale_down_to
        ),
        now=now.timestamp(),
    )
    replicas = decision.replicas if live_replicas is not None else clamp(decision.replicas, bounds)
    last_scale, event = before.last_scale_time, None
    if live_replicas is not None and replicas != current:
        last_scale = now
        event = f"scaled from {current} to {replicas} replicas (backlog {backlog})"
    down_since = decision.state.down_since
    moment = (
        None if down_since is None else datetime.datetime.fromtimestamp(down_since, datetime.UTC)
    )
    row = QueueStatus(
        name=queue.name,
        backlog=backlog,
        pending=pending,
        replicas=replicas,
        desired_replicas=decision.recommended,
        last_scale_time=last_scale,
        scale_down_since=moment,
        scale_down_to=decision.state.down_to,
    )
    return ScaleStep(replicas=replicas, row=_row(row), event=event)


def _row(queue: QueueStatus) -> dict[str, Any]:
    row = queue.model_dump(by_alias=True, exclude_none=True)
    for key in ("lastScaleTime", "scaleDownSince"):
        if isinstance(row.get(key), datetime.datetime):
            row[key] = iso(row[key])
    return row
