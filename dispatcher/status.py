"""What ``dispatcher status`` reports: the outbox, its DLQ, every task stream, the shard key.

Gathering talks to PostgreSQL and Redis; rendering (text or JSON) is pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.backpressure import MemoryMarks, memory_ratio
from dispatcher.outbox.queries import QUERIES
from dispatcher.outbox.repository import STATUSES, OutboxRepository
from dispatcher.redis_client import RedisClient, aof_enabled, server_infos
from dispatcher.stream.cancel_keys import count_cancelled
from dispatcher.stream.limit_keys import LimitUsage, limited_queues, read_usage, render_usage
from dispatcher.stream.naming import (
    DEAD_STREAM_PREFIX,
    SHARDS_KEY,
    TASK_STREAM_PREFIX,
    WORKER_GROUP,
)
from dispatcher.stream.shard_count import read_published_count
from dispatcher.stream.stats import StreamStats, streams_stats

__all__ = ["SCAN_COUNT", "StatusReport", "find_streams", "gather_status", "render_text"]

SCAN_COUNT = 1000


@dataclass(frozen=True, slots=True)
class StatusReport:
    outbox: dict[str, int]
    oldest_pending_age_seconds: float | None
    dlq: int
    # composer:stream_shards, the count the enqueuers route by; None while it is not set.
    stream_shards: int | None
    group: str
    streams: list[StreamStats]
    dead_letters: dict[str, int]
    # Used / maxmemory of the fullest Redis master; None when no maxmemory is set.
    redis_memory: float | None = None
    # Redis runs with appendonly yes (every master of a Cluster): its streams survive a restart.
    redis_aof: bool | None = None
    # Runs cancelled for the workers now (workflow.cancel.runs), and cancels committed that no
    # enqueuer has recorded there yet (outbox_cancel).
    cancelled_runs: int = 0
    cancels_waiting: int = 0
    # Every queue with limits: the limits and their use now.
    limits: list[LimitUsage] = dataclasses.field(default_factory=list)
    # Why composer:stream_shards cannot be read as a count (stream_shards is then None).
    stream_shards_error: str | None = None

    @property
    def backpressure(self) -> bool:
        """Redis is past the enqueuers' default high mark: they hold rows in the outbox."""
        return self.redis_memory is not None and self.redis_memory >= MemoryMarks().high

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["streams"] = [dataclasses.asdict(s) for s in self.streams]
        doc["limits"] = [usage.to_json() for usage in self.limits]
        doc["backpressure"] = self.backpressure
        return doc


async def find_streams(client: RedisClient, prefix: str) -> list[str]:
    """Every stream whose name starts with ``prefix`` (all nodes of a Cluster), sorted.

    A SCAN walks the whole keyspace (attempt keys included): 1,000 keys a call, not Redis'
    default 10, so a big keyspace costs a few hundred round trips, not tens of thousands.
    """
    found = {
        str(key)
        async for key in client.scan_iter(match=f"{prefix}*", count=SCAN_COUNT, _type="STREAM")
    }
    return sorted(found)


async def gather_status(
    *, pool: AsyncConnectionPool[Any], redis: RedisClient, group: str = WORKER_GROUP
) -> StatusReport:
    counts = await OutboxRepository(pool).status_counts()
    waiting = [counts.oldest_age_seconds[s] for s in ("PENDING", "RETRY") if s in counts.by_status]
    streams = await streams_stats(redis, await find_streams(redis, TASK_STREAM_PREFIX), group)
    dead = {
        name.removeprefix(DEAD_STREAM_PREFIX): int(await redis.xlen(name))
        for name in await find_streams(redis, DEAD_STREAM_PREFIX)
    }
    async with pool.connection() as conn:
        relaying = await (await conn.execute(QUERIES["cancels_waiting"])).fetchone()
    shards, shards_error = await read_published_count(redis)
    infos = await server_infos(redis, "memory")
    ratios = [memory_ratio(info) for info in infos if int(info.get("maxmemory", 0) or 0)]
    return StatusReport(
        outbox={**{s: counts.by_status.get(s, 0) for s in STATUSES}, "IN_FLIGHT": counts.in_flight},
        oldest_pending_age_seconds=max(waiting) if waiting else None,
        dlq=counts.dlq,
        stream_shards=shards,
        stream_shards_error=shards_error,
        group=group,
        streams=streams,
        dead_letters=dead,
        redis_memory=max(ratios) if ratios else None,
        redis_aof=await aof_enabled(redis),
        cancelled_runs=await count_cancelled(redis),
        cancels_waiting=int(relaying[0]) if relaying else 0,
        limits=[await read_usage(redis, queue) for queue in await limited_queues(redis)],
    )


def _memory_line(report: StatusReport) -> str:
    if report.redis_memory is None:
        return "redis memory: no maxmemory set (backpressure off)"
    line = f"redis memory: {report.redis_memory:.0%} of maxmemory"
    if report.backpressure:
        line += f" - BACKPRESSURE: enqueuers hold rows in the outbox above {MemoryMarks().high:.0%}"
    return line


def _persistence_line(report: StatusReport) -> str:
    if report.redis_aof is None:
        return "redis persistence: unknown"
    if report.redis_aof:
        return "redis persistence: aof on"
    return "redis persistence: aof off - a restart of Redis loses the streams (appendonly yes)"


def render_text(report: StatusReport) -> str:
    age = report.oldest_pending_age_seconds
    lines = [
        "outbox: " + ", ".join(f"{k} {v}" for k, v in report.outbox.items()),
        f"oldest pending: {'-' if age is None else f'{age:.1f} s'}",
        f"outbox_dlq: {report.dlq}",
        f"cancelled runs: {report.cancelled_runs} (not yet recorded: {report.cancels_waiting})",
        f"{SHARDS_KEY}: {report.stream_shards or report.stream_shards_error or '(not set)'}",
        _memory_line(report),
        _persistence_line(report),
        "",
        f"{'stream':<48} {'length':>8} {'pending':>8} {'consumers':>9} {'lag':>6}",
    ]
    for s in report.streams:
        lag = "-" if s.lag is None else str(s.lag)
        lines.append(f"{s.stream:<48} {s.length:>8} {s.pending:>8} {s.consumers:>9} {lag:>6}")
    if not report.streams:
        lines.append("(no task streams yet)")
    for queue, length in report.dead_letters.items():
        lines.append(f"dead letters of {queue}: {length} ({DEAD_STREAM_PREFIX}{queue})")
    lines += render_usage(report.limits)
    return "\n".join(lines)
