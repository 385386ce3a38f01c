"""The autoscaling policy of a worker Deployment: pure, clock passed in.

The backlog of a queue is the total length of its shard streams: acked
entries are deleted (XACK+XDEL), so what is left is waiting or in flight.
Redis' consumer-group ``lag`` is not used: it is unknown after deletions.

``recommend`` = clamp(ceil(backlog / target), min, max). ``decide`` applies
it with hysteresis: up at once; down only once every recommendation for a
whole stabilization window was lower, and then to the highest of them (so a
short dip never removes capacity a burst will need again). An unknown backlog
(Redis unreachable) holds the current size and the window state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ScaleDecision", "ScalePolicy", "ScaleState", "clamp", "decide", "recommend"]


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    target_backlog_per_replica: int
    stabilization_seconds: float

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 0 <= min_replicas <= max_replicas")
        if self.target_backlog_per_replica < 1:
            raise ValueError("target_backlog_per_replica must be >= 1")


@dataclass(frozen=True, slots=True)
class ScaleState:
    """Memory of a pending scale-down: since when, and to how many at least."""

    down_since: float | None = None
    down_to: int | None = None


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int  # what the Deployment should have now
    recommended: int | None  # this tick's recommendation (None: backlog unknown)
    state: ScaleState

    def changes(self, current: int) -> bool:
        return self.replicas != current


def clamp(value: int, policy: ScalePolicy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, value))


def recommend(backlog: int, policy: ScalePolicy) -> int:
    """Replicas for ``backlog`` entries at the target per replica, within bounds."""
    wanted = math.ceil(max(backlog, 0) / policy.target_backlog_per_replica)
    return clamp(wanted, policy)


def decide(
    *, current: int, backlog: int | None, policy: ScalePolicy, state: ScaleState, now: float
) -> ScaleDecision:
    """How many replicas to run now, and the window state to remember."""
    if backlog is None:
        return ScaleDecision(replicas=current, recommended=None, state=state)
    wanted = recommend(backlog, policy)
    if current > policy.max_replicas:  # the bounds changed: obey them at once
        return ScaleDecision(replicas=policy.max_replicas, recommended=wanted, state=ScaleState())
    if wanted >= current:
        return ScaleDecision(replicas=wanted, recommended=wanted, state=ScaleState())
    since = state.down_since if state.down_since is not None else now
    down_to = max(wanted, state.down_to if state.down_to is not None else wanted)
    if now - since >= policy.stabilization_seconds:
        return ScaleDecision(replicas=down_to, recommended=wanted, state=ScaleState())
    return ScaleDecision(
        replicas=current, recommended=wanted, state=ScaleState(down_since=since, down_to=down_to)
    )
