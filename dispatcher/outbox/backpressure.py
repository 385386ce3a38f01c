"""Backpressure from Redis memory: the outbox holds the backlog while Redis is nearly full.

When workers fall behind, streams grow until Redis reaches ``maxmemory``; under
``noeviction`` every XADD is then refused. Publishing into that only burns
retry attempts and dead-letters healthy rows, and a Redis with no headroom
left also refuses the workers' own lease writes, so nothing drains. The
outbox is the better buffer: above a high mark of ``maxmemory`` the enqueuer
stops claiming and leaves rows PENDING (no attempt counted), and it resumes
below a low mark, so workers always have room to work the backlog down.

The reading is ``INFO memory`` (the largest ratio over every master), taken at
most once a ``check_every`` seconds, and sooner when what was published since
the last reading could cross the high mark: at full drain speed an enqueuer
can publish tens of megabytes a second. An OOM reply pauses at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient, server_infos

__all__ = ["MemoryMarks", "RedisMemoryGate", "memory_ratio", "paused_next"]

log = logging.getLogger(__name__)

# Bytes of Redis memory per byte of field data in a stream entry, and per entry: a margin
# over what listpack-encoded streams measure, so the estimate errs towards reading early.
_ENTRY_FACTOR = 2.0
_ENTRY_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class MemoryMarks:
    """Pause at ``high`` x maxmemory, resume below ``low`` x maxmemory; ``high`` 0 = off."""

    high: float = 0.85
    low: float = 0.75

    def __post_init__(self) -> None:
        if self.high and not 0 < self.low < self.high <= 1:
            raise ValueError(
                f"need 0 < low ({self.low:g}) < high ({self.high:g}) <= 1 for Redis memory marks"
            )


def memory_ratio(info: dict[str, Any]) -> float:
    """Used over maxmemory as Redis counts it for OOM (0 when no maxmemory is set)."""
    limit = int(info.get("maxmemory", 0) or 0)
    if limit <= 0:
        return 0.0
    used = int(info.get("used_memory", 0)) - int(info.get("mem_not_counted_for_evict", 0) or 0)
    return max(used, 0) / limit


def paused_next(paused: bool, ratio: float, marks: MemoryMarks) -> bool:
    """The hysteresis: pause at the high mark, stay paused until below the low mark."""
    if not marks.high:
        return False
    return ratio >= marks.low if paused else ratio >= marks.high


class RedisMemoryGate:
    """Says whether the enqueuer may claim another batch; see the module docstring."""

    def __init__(
        self,
        client: RedisClient,
        *,
        marks: MemoryMarks = MemoryMarks(),
        check_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.marks = marks
        self._check_every = check_every
        self._clock = clock
        self.paused = False
        self.ratio = 0.0
        self._limit = 0  # maxmemory of the fullest master at the last reading
        self._read_at: float | None = None
        self._since = 0  # estimated bytes published since the last reading

    async def allows(self) -> bool:
        """True when a batch may be claimed now."""
        if not self.marks.high:
            return True
        if self._due():
            await self._read()
        return not self.paused

    def open_now(self) -> bool:
        """True when a batch may be claimed now without reading Redis's memory first."""
        return not self.marks.high or (not self._due() and not self.paused)

    def published(self, fields_bytes: int, entries: int) -> None:
        """Account for a batch just published (its field bytes and entry count)."""
        self._since += int(fields_bytes * _ENTRY_FACTOR) + entries * _ENTRY_OVERHEAD

    def refused(self) -> None:
        """Redis answered OOM: pause now, and read the memory again before resuming."""
        if self.marks.high:
            self._set(True)
            self._read_at = None

    def _due(self) -> bool:
        if self._read_at is None or self._clock() - self._read_at >= self._check_every:
            return True
        # Re-read once what was published since could have used half the remaining headroom.
        return self.ratio > 0 and self._since >= self._headroom_bytes() / 2

    def _headroom_bytes(self) -> float:
        return max(self.marks.high - self.ratio, 0.0) * self._limit

    async def _read(self) -> None:
        try:
            infos = await server_infos(self._client, "memory")
        except (RedisError, OSError) as exc:
            # Redis unreachable: publishing fails and retries as usual; do not pause on it.
            log.debug("could not read Redis memory: %s", exc)
            self._read_at = self._clock()
            return
        self._read_at = self._clock()
        self._since = 0
        worst = max(infos, key=memory_ratio, default={})
        self.ratio = memory_ratio(worst)
        self._limit = int(worst.get("maxmemory", 0) or 0)
        self._set(paused_next(self.paused, self.ratio, self.marks))

    def _set(self, paused: bool) -> None:
        if paused != self.paused:
            if paused:
                log.warning(
                    "backpressure: Redis memory at %.0f%% of maxmemory; pausing claims, rows "
                    "stay PENDING until it is below %.0f%%",
                    self.ratio * 100,
                    self.marks.low * 100,
                )
            else:
                log.info("backpressure off: Redis memory at %.0f%%; claiming", self.ratio * 100)
        self.paused = paused
