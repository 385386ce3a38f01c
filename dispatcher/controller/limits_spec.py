"""A queue's limits in the spec (``spec.queues[].limits``), and the pass that puts them in Redis.

``LimitsSpec`` is the CRD's ``limits`` of a queue (its CEL rule has a
pydantic twin, as in ``dispatcher.controller.model``). A queue that sets it is owned:
each pass reads the limits keys of those queues (one pipelined round trip)
and writes only the ones that differ from the spec (``limits_to_write``, a
pure decision), so a ``dispatcher limits set`` on such a queue lasts until
the next pass. ``limits: {}`` owns the queue with no limits. A queue without
``limits`` is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from dispatcher.controller.resource import ResourceModel, cel_rule
from dispatcher.redis_client import RedisClient, queue_get_raw
from dispatcher.stream.limit_keys import (
    MAX_RATE,
    MAX_SLOTS,
    MIN_RATE,
    InvalidLimits,
    QueueLimits,
    limits_key,
    parse_limits,
)

__all__ = ["BURST_RULE", "LimitsSpec", "limits_to_write", "publish_limits"]

BURST_RULE = cel_rule("!has(self.burst) || has(self.rate)", "burst requires rate")


class LimitsSpec(ResourceModel):
    """A queue's limits across every worker of the queue, in every pod."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [BURST_RULE]})

    max_in_flight: int | None = Field(
        default=None, ge=1, le=MAX_SLOTS, description="handler runs at once across every worker"
    )
    rate: float | None = Field(
        default=None,
        ge=MIN_RATE,
        le=MAX_RATE,
        description="runs started per second across every worker (a token bucket)",
    )
    burst: int | None = Field(
        default=None, ge=1, le=MAX_SLOTS, description="runs the rate lets start at once (1)"
    )

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> LimitsSpec:
        if self.burst is not None and self.rate is None:
            raise ValueError(BURST_RULE["message"])
        return self

    def limits(self) -> QueueLimits:
        return QueueLimits(max_in_flight=self.max_in_flight, rate=self.rate, burst=self.burst)


def limits_to_write(
    wanted: Mapping[str, QueueLimits], found: Mapping[str, str | bytes | None]
) -> dict[str, QueueLimits]:
    """The queues whose key does not hold what the spec wants (absent or invalid included)."""
    changes = {}
    for queue, limits in wanted.items():
        raw = found.get(queue)
        try:
            current = None if raw is None else parse_limits(raw, source=limits_key(queue))
        except InvalidLimits:
            current = None
        if current != limits:
            changes[queue] = limits
    return changes


async def publish_limits(
    client: RedisClient, queues: Sequence[Any], *, events: list[tuple[str, str, bool]]
) -> None:
    """Write the limits of the queues that set them, where Redis holds something else.

    ``queues`` are the spec's ``QueueSpec``; a Redis error is left to the next pass.
    """
    wanted = {q.name: q.limits.limits() for q in queues if q.limits is not None}
    if not wanted:
        return
    pipe = client.pipeline(transaction=False)
    for queue in wanted:
        queue_get_raw(pipe, limits_key(queue))  # bytes: not UTF-8 is rewritten, not a crash
    # A key of another type (WRONGTYPE) is not limits: rewritten like garbage (SET replaces it).
    replies = await pipe.execute(raise_on_error=False)
    found = {
        q: None if isinstance(r, Exception) else r for q, r in zip(wanted, replies, strict=True)
    }
    for queue, limits in limits_to_write(wanted, found).items():
        await client.set(limits_key(queue), limits.to_json())
        events.append(("LimitsPublished", f"queue {queue}: limits {limits.describe()}", False))
