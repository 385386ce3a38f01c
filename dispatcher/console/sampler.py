"""What the console's page polls: one sample of every queue, taken on a timer, kept for charts.

A ``Sampler`` reads Redis and PostgreSQL once per refresh interval however many
pages poll (they all get the last sample), and only while someone looks: after
``idle_after`` seconds without a poll it stops until the next one. A sample
costs a few O(1) commands per shard stream (XLEN, XINFO GROUPS, XINFO STREAM,
XINFO CONSUMERS: never a range of entries) and the outbox counts of
``dispatcher status``. Which streams exist comes from a SCAN, which walks the
whole keyspace, so it runs once every ``discover_every`` seconds (one walk for
both task and dead-letter streams) and after an action, never per sample. A
queue shows once it has a stream; its limits are read by name.

Rates come from counters Redis keeps: what left a queue's streams is their
``entries-added`` less their length (handled, cancelled or dead-lettered); what
was dead-lettered is the dead stream's ``entries-added``; handled is the rest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool
from redis.exceptions import ResponseError

from dispatcher.outbox.queries import QUERIES
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.redis_client import RedisClient
from dispatcher.status import find_streams
from dispatcher.stream.cancel_keys import count_cancelled
from dispatcher.stream.discovery import ShardState
from dispatcher.stream.limit_keys import LimitUsage, read_usage
from dispatcher.stream.naming import (
    DEAD_STREAM_PREFIX,
    SHARDS_KEY,
    TASK_STREAM_PREFIX,
    dead_letter_stream,
    parse_task_stream,
    task_stream,
)
from dispatcher.stream.shard_count import parse_shard_count
from dispatcher.stream.stats import stream_stats

__all__ = ["Consumer", "QueueSample", "Sample", "Sampler", "one_line"]

# What task and dead-letter stream names begin with: one SCAN pattern finds both.
STREAM_PREFIX = os.path.commonprefix([TASK_STREAM_PREFIX, DEAD_STREAM_PREFIX])  # noqa: RUF071

log = logging.getLogger("dispatcher.console")


@dataclass(frozen=True, slots=True)
class Consumer:
    """One worker process (a consumer of the group) as the streams of one queue see it."""

    queue: str
    name: str
    pending: int  # entries it holds: delivered to it, not acked yet
    idle_ms: int  # since its last read or claim
    inactive_ms: int | None  # since its last successful read (Redis >= 7.2)
    streams: int


@dataclass(frozen=True, slots=True)
class QueueSample:
    name: str
    shards: list[ShardState]
    dead_letters: int
    limits: LimitUsage | None
    handled_per_s: float | None = None
    failed_per_s: float | None = None
    # Counters the next sample's rates are computed from (None: Redis does not keep them).
    left: int | None = None
    dead_added: int | None = None

    @property
    def in_flight(self) -> int:
        return sum(s.stats.pending for s in self.shards)

    @property
    def backlog(self) -> int:
        return sum(max(s.stats.length - s.stats.pending, 0) for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backlog": self.backlog,
            "in_flight": self.in_flight,
            "consumers": max((s.stats.consumers for s in self.shards), default=0),
            "handled_per_s": self.handled_per_s,
            "failed_per_s": self.failed_per_s,
            "dead_letters": self.dead_letters,
            "limits": None if self.limits is None else self.limits.to_json(),
            "shards": [
                {
                    "shard": s.shard,
                    "stream": s.stats.stream,
                    "length": s.stats.length,
                    "pending": s.stats.pending,
                    "lag": s.stats.lag,
                    "consumers": s.stats.consumers,
                    "in_count": s.in_count,
                    "draining": s.draining,
                }
                for s in self.shards
            ],
        }


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    shard_count: int | None
    outbox: dict[str, int]
    oldest_pending_age_seconds: float | None
    outbox_dlq: int
    cancelled_runs: int
    cancels_waiting: int
    queues: list[QueueSample]
    workers: list[Consumer]

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "shard_count": self.shard_count,
            "outbox": self.outbox,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            "outbox_dlq": self.outbox_dlq,
            "cancelled_runs": self.cancelled_runs,
            "cancels_waiting": self.cancels_waiting,
            "queues": [q.to_json() for q in self.queues],
            "workers": [
                {
                    "queue": w.queue,
                    "name": w.name,
                    "pending": w.pending,
                    "idle_ms": w.idle_ms,
                    "inactive_ms": w.inactive_ms,
                    "streams": w.streams,
                }
                for w in self.workers
            ],
        }

    def point(self) -> dict[str, Any]:
        """The sample as one point of the charts: per queue backlog, in flight and rates."""
        return {
            "t": self.at,
            "queues": {
                q.name: [q.backlog, q.in_flight, q.handled_per_s, q.failed_per_s]
                for q in self.queues
            },
        }


@dataclass(slots=True)
class _Found:
    """What the last SCAN found: each queue and the shard numbers of its streams."""

    at: float = float("-inf")
    shards: dict[str, set[int]] = field(default_factory=dict)


class Sampler:
    """Takes samples while the page is watched; keeps ``history_seconds`` of points."""

    def __init__(
        self,
        *,
        redis: RedisClient,
        pool: AsyncConnectionPool[Any],
        group: str,
        fallback_shards: int,
        refresh: float = 2.0,
        discover_every: float = 60.0,
        idle_after: float = 60.0,
        history_seconds: float = 900.0,
    ) -> None:
        self._redis, self._pool, self._group = redis, pool, group
        self._fallback = fallback_shards
        self.refresh, self._discover_every, self._idle_after = refresh, discover_every, idle_after
        self._found = _Found()
        self.history: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max(int(history_seconds / refresh), 1)
        )
        self.last: Sample | None = None
        self.error: str | None = None
        self._viewed_at = float("-inf")
        self._wake = asyncio.Event()
        self._sampled = asyncio.Event()

    def rediscover(self) -> None:
        """Scan for streams at the next sample and take it now (after an action)."""
        self._found.at = float("-inf")
        self._wake.set()

    async def latest(self, *, within: float = 10.0) -> Sample | None:
        """The last sample; waits for the first one after an idle spell. Marks the page watched."""
        self._viewed_at = time.monotonic()
        if self._sampled.is_set():
            return self.last
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sampled.wait(), within)
        return self.last

    async def run(self) -> None:
        while True:
            if time.monotonic() - self._viewed_at > self._idle_after:
                self._sampled.clear()  # the next poll waits for a fresh sample
                self._wake.clear()
                await self._wake.wait()
            try:
                self.last = await self.sample()
                self.error = None
                self.history.append(self.last.point())
            except Exception as exc:  # a server down: the page says so, the loop goes on
                log.debug("sample failed", exc_info=True)
                self.error = one_line(exc)
            self._sampled.set()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.refresh)

    async def _discover(self) -> dict[str, set[int]]:
        if time.monotonic() - self._found.at < self._discover_every:
            return self._found.shards
        shards: dict[str, set[int]] = {}
        # One walk of the keyspace finds both kinds: workflow.tasks.* and workflow.dead.*.
        for name in await find_streams(self._redis, STREAM_PREFIX):
            if name.startswith(DEAD_STREAM_PREFIX):
                shards.setdefault(name.removeprefix(DEAD_STREAM_PREFIX), set())
                continue
            try:
                queue, shard = parse_task_stream(name)
            except ValueError:  # workflow.cancel.signal, or not one of ours
                continue
            shards.setdefault(queue, set()).add(shard)
        self._found = _Found(at=time.monotonic(), shards=shards)
        return shards

    async def sample(self) -> Sample:
        """Read everything the page shows once (see the module's docstring for the cost)."""
        found = await self._discover()
        raw = await self._redis.get(SHARDS_KEY)
        count = None if raw is None else parse_shard_count(raw)
        in_force = count or self._fallback
        now = time.time()
        queues, workers = [], []
        for queue, known in sorted(found.items()):
            shards = sorted(set(range(in_force)) | known)
            q, w = await self._queue(queue, shards, in_force=in_force, at=now)
            queues.append(q)
            workers += w
        counts = await OutboxRepository(self._pool).status_counts()
        async with self._pool.connection() as conn:
            due = await (await conn.execute(QUERIES["outbox_due_later"])).fetchone()
            relaying = await (await conn.execute(QUERIES["cancels_waiting"])).fetchone()
        waiting = [
            counts.oldest_age_seconds[s] for s in ("PENDING", "RETRY") if s in counts.by_status
        ]
        return Sample(
            at=now,
            shard_count=count,
            outbox={
                "pending": counts.by_status.get("PENDING", 0),
                "due_later": int(due[0]) if due else 0,
                "retrying": counts.by_status.get("RETRY", 0),
                "in_flight": counts.in_flight,
            },
            oldest_pending_age_seconds=max(waiting) if waiting else None,
            outbox_dlq=counts.dlq,
            cancelled_runs=await count_cancelled(self._redis),
            cancels_waiting=int(relaying[0]) if relaying else 0,
            queues=queues,
            workers=workers,
        )

    async def _queue(
        self, queue: str, shards: Iterable[int], *, in_force: int, at: float
    ) -> tuple[QueueSample, list[Consumer]]:
        states: list[ShardState] = []
        consumers: dict[str, Consumer] = {}
        left: int | None = 0
        for shard in shards:
            stream = task_stream(queue, shard)
            stats = await stream_stats(self._redis, stream, self._group)
            states.append(ShardState(shard=shard, stats=stats, in_count=shard < in_force))
            added = await self._added(stream)
            left = None if left is None or added is None else left + added - stats.length
            if stats.consumers:
                for c in await self._consumers(stream):
                    seen = consumers.get(c.name)
                    consumers[c.name] = c if seen is None else _merged(seen, c)
        dead = dead_letter_stream(queue)
        dead_letters = int(await self._redis.xlen(dead))
        dead_added = await self._added(dead)
        usage = await read_usage(self._redis, queue)
        sample = QueueSample(
            name=queue,
            shards=states,
            dead_letters=dead_letters,
            limits=None if usage.limits is None and usage.error is None else usage,
            left=left,
            dead_added=dead_added,
        )
        workers = [
            Consumer(queue, c.name, c.pending, c.idle_ms, c.inactive_ms, c.streams)
            for c in sorted(consumers.values(), key=lambda c: c.name)
        ]
        return self._with_rates(sample, at=at), workers

    async def _added(self, stream: str) -> int | None:
        """Entries ever added to ``stream`` (XINFO STREAM, Redis >= 7); None when unknown."""
        try:
            info: dict[str, Any] = await self._redis.xinfo_stream(stream)
        except ResponseError:  # no such stream (yet, or any more)
            return 0
        added = info.get("entries-added")
        return None if added is None else int(added)

    async def _consumers(self, stream: str) -> list[Consumer]:
        try:
            found: list[dict[str, Any]] = await self._redis.xinfo_consumers(stream, self._group)
        except ResponseError:
            return []
        return [
            Consumer(
                queue="",
                name=str(c.get("name")),
                pending=int(c.get("pending") or 0),
                idle_ms=int(c.get("idle") or 0),
                inactive_ms=None if c.get("inactive") is None else int(c["inactive"]),
                streams=1,
            )
            for c in found
        ]

    def _with_rates(self, q: QueueSample, *, at: float) -> QueueSample:
        before = next(
            (p for p in (self.last.queues if self.last else []) if p.name == q.name), None
        )
        if before is None or self.last is None or at <= self.last.at:
            return q
        spent = at - self.last.at
        failed = _delta(before.dead_added, q.dead_added)
        left = _delta(before.left, q.left)
        return QueueSample(
            name=q.name,
            shards=q.shards,
            dead_letters=q.dead_letters,
            limits=q.limits,
            handled_per_s=None if left is None else max(left - (failed or 0), 0) / spent,
            failed_per_s=None if failed is None else failed / spent,
            left=q.left,
            dead_added=q.dead_added,
        )


def one_line(exc: BaseException) -> str:
    """``Type: first line`` of an error: what the page shows (drivers never put passwords there)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _delta(before: int | None, now: int | None) -> int | None:
    """A counter's growth; a counter that went back (its stream deleted) counts from zero."""
    if before is None or now is None:
        return None
    return now - before if now >= before else now


def _merged(a: Consumer, b: Consumer) -> Consumer:
    inactive = [x for x in (a.inactive_ms, b.inactive_ms) if x is not None]
    return Consumer(
        queue=a.queue,
        name=a.name,
        pending=a.pending + b.pending,
        idle_ms=min(a.idle_ms, b.idle_ms),
        inactive_ms=min(inactive) if inactive else None,
        streams=a.streams + b.streams,
    )
