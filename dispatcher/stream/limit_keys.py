"""Queue limits kept in Redis: one configuration key per queue, and what it holds now.

A queue's limits live in ``composer:limits:{<queue>}`` as JSON
(``{"max_in_flight": 4, "rate": 20.0, "burst": 5}``; an absent key: no
limits). Written only by an explicit change (``dispatcher limits set``, the
operator's ``spec.queues[].limits``); every worker of the queue reads it live
(``REFRESH_EVERY``). Their state sits beside it, in the same Redis Cluster
hash slot (the ``{<queue>}`` tag): ``dispatcher:limits:{<queue>}:held``
(runs holding a slot, per worker process), ``...:alive`` (when each worker's
slots end unless renewed, Redis's clock) and ``...:tat`` (the token bucket's
theoretical arrival time, GCRA); ``dispatcher.worker.limit_scripts`` says how.

Pure parsing and naming here, plus the few reads and writes the CLI, the
status and the operator share; the worker's side is ``dispatcher.worker.limit_gate``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import ResponseError

from dispatcher.redis_client import RedisClient, get_raw
from dispatcher.stream.naming import validate_queue

__all__ = [
    "LIMITS_PREFIX",
    "MAX_RATE",
    "MAX_SLOTS",
    "MIN_RATE",
    "REFRESH_EVERY",
    "InvalidLimits",
    "LimitUsage",
    "QueueLimits",
    "alive_key",
    "held_key",
    "limited_queues",
    "limits_key",
    "parse_limits",
    "read_limits",
    "read_usage",
    "render_usage",
    "tokens_key",
    "tokens_left",
    "write_limits",
]

LIMITS_PREFIX = "composer:limits:"
# How stale a worker's view of a queue's limits may be: a change is in force after it.
REFRESH_EVERY = 1.0
# Bounds that keep the arithmetic of the scripts exact and a typo from meaning "unlimited".
MAX_SLOTS = 1_000_000
MAX_RATE = 1_000_000.0
MIN_RATE = 0.001  # a run every 1,000 s; a bound the CRD can say (it has no exclusive minimum)


class InvalidLimits(ValueError):
    """A limits key or a requested change that is not a valid set of limits."""


class QueueLimits(BaseModel):
    """A queue's limits: runs at once across every worker, runs started per second."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_in_flight: int | None = Field(
        None, ge=1, le=MAX_SLOTS, description="handler runs at once across every worker"
    )
    rate: float | None = Field(
        None, ge=MIN_RATE, le=MAX_RATE, description="runs started per second (a token bucket)"
    )
    burst: int | None = Field(
        None, ge=1, le=MAX_SLOTS, description="runs the bucket lets start at once (default 1)"
    )

    @pydantic.model_validator(mode="after")
    def _burst_needs_rate(self) -> QueueLimits:
        if self.burst is not None and self.rate is None:
            raise ValueError("burst requires rate")
        return self

    @property
    def empty(self) -> bool:
        return self.max_in_flight is None and self.rate is None

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two tokens; 0 without a rate."""
        return 1000.0 / self.rate if self.rate else 0.0

    @property
    def bucket(self) -> int:
        """Tokens the bucket holds when full (``burst``, 1 by default); 0 without a rate."""
        return (self.burst or 1) if self.rate else 0

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True)

    def describe(self) -> str:
        parts = []
        if self.max_in_flight is not None:
            parts.append(f"max in flight {self.max_in_flight}")
        if self.rate is not None:
            parts.append(f"rate {self.rate:g}/s burst {self.bucket}")
        return ", ".join(parts) or "none"


def parse_limits(raw: str | bytes, *, source: str) -> QueueLimits:
    """A queue's limits from the JSON of its key; ``InvalidLimits`` naming ``source`` else."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise InvalidLimits(f"{source} holds invalid limits (not UTF-8): {raw!r:.200}") from None
    try:
        return QueueLimits.model_validate_json(text)
    except pydantic.ValidationError as exc:
        why = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidLimits(f"{source} holds invalid limits ({why}): {text[:200]!r}") from None


def limits_key(queue: str) -> str:
    return f"{LIMITS_PREFIX}{{{validate_queue(queue)}}}"


def held_key(queue: str) -> str:
    """The runs holding a slot of ``queue``, per worker process (a hash)."""
    return f"dispatcher:limits:{{{validate_queue(queue)}}}:held"


def alive_key(queue: str) -> str:
    """When the slots of each worker process of ``queue`` end unless renewed (a sorted set)."""
    return f"dispatcher:limits:{{{validate_queue(queue)}}}:alive"


def tokens_key(queue: str) -> str:
    return f"dispatcher:limits:{{{validate_queue(queue)}}}:tat"


def queue_of_limits_key(key: str) -> str | None:
    """The queue of ``composer:limits:{<queue>}``; None for any other key."""
    rest = key.removeprefix(LIMITS_PREFIX)
    if rest == key or not (rest.startswith("{") and rest.endswith("}")):
        return None
    try:
        return validate_queue(rest[1:-1])
    except ValueError:
        return None


async def read_limits(client: RedisClient, queue: str) -> QueueLimits | None:
    """The queue's limits; None when it has none. Raises ``InvalidLimits`` on a bad key."""
    key = limits_key(queue)
    try:
        raw = await get_raw(client, key)
    except ResponseError as exc:  # WRONGTYPE: a hash, a stream... written by hand
        raise InvalidLimits(f"{key} cannot be read as limits: {exc}") from None
    return None if raw is None else parse_limits(raw, source=key)


async def write_limits(client: RedisClient, queue: str, limits: QueueLimits | None) -> None:
    """Set the queue's limits (validated again: never trusted); None or empty removes them."""
    key = limits_key(queue)
    if limits is None or limits.empty:
        await client.delete(key)
        return
    checked = QueueLimits.model_validate(limits.model_dump())
    await client.set(key, checked.to_json())


async def limited_queues(client: RedisClient) -> list[str]:
    """Every queue with a limits key (all nodes of a Cluster), sorted."""
    found = {str(key) async for key in client.scan_iter(match=f"{LIMITS_PREFIX}*", count=1000)}
    return sorted(q for key in found if (q := queue_of_limits_key(key)) is not None)


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """What a queue's limits hold now: runs holding a slot, tokens in the bucket."""

    queue: str
    limits: QueueLimits | None
    in_use: int
    tokens: int | None  # None without a rate
    error: str | None = None  # the key could not be read as limits

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "limits": None if self.limits is None else self.limits.model_dump(exclude_none=True),
            "in_use": self.in_use,
            "tokens": self.tokens,
            "error": self.error,
        }


def tokens_left(limits: QueueLimits, *, tat_ms: float | None, now_ms: float) -> int | None:
    """Tokens the bucket holds at ``now_ms`` given its theoretical arrival time (GCRA)."""
    if not limits.rate:
        return None
    used = max((tat_ms or 0.0) - now_ms, 0.0) / limits.interval_ms
    return max(limits.bucket - math.ceil(used - 1e-9), 0)


async def read_usage(client: RedisClient, queue: str) -> LimitUsage:
    """The queue's limits and their current use, read in Redis's clock."""
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros / 1000
    try:
        limits = await read_limits(client, queue)
    except InvalidLimits as exc:
        return LimitUsage(queue, None, 0, None, error=str(exc))
    try:  # raw: any bytes; a key of the wrong type counts nothing (a claim clears it)
        in_use = await _slots_in_use(client, queue, now_ms)
        raw_tat = await get_raw(client, tokens_key(queue))
    except ResponseError:
        in_use, raw_tat = 0, None
    try:
        tat = float(raw_tat) if raw_tat is not None else None
    except ValueError:
        tat = None  # garbage there is overwritten by the next claim; show a full bucket
    tokens = None if limits is None else tokens_left(limits, tat_ms=tat, now_ms=now_ms)
    return LimitUsage(queue, limits, in_use, tokens)


async def _slots_in_use(client: RedisClient, queue: str, now_ms: float) -> int:
    """The slots held by workers alive now, as the claims count them (numbers only)."""
    alive = await client.execute_command(
        "ZRANGEBYSCORE", alive_key(queue), now_ms, "+inf", NEVER_DECODE=True
    )
    if not alive:
        return 0
    counts = await client.execute_command("HMGET", held_key(queue), *alive, NEVER_DECODE=True)
    return sum(int(count) for count in counts if count is not None and count.isdigit())


def render_usage(usages: list[LimitUsage]) -> list[str]:
    """One line per queue with limits: the limits, and what holds them now."""
    lines = []
    for usage in usages:
        limits = usage.limits
        if usage.error is not None:
            kept = "workers keep what they last read"
            lines.append(f"limits of {usage.queue}: INVALID ({kept}): {usage.error}")
        elif limits is not None:
            parts = [f"limits of {usage.queue}: {limits.describe()}"]
            if limits.max_in_flight is not None:
                parts.append(f"in flight {usage.in_use}/{limits.max_in_flight}")
            else:
                parts.append(f"in flight {usage.in_use}")
            if usage.tokens is not None:
                parts.append(f"tokens {usage.tokens}/{limits.bucket}")
            lines.append("; ".join(parts))
    return lines
