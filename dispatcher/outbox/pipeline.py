"""One batch from claim to report: lock -> encode -> publish -> settle -> report.

A batch is one transaction: it locks due rows (FOR UPDATE SKIP LOCKED),
encodes each row's stream entry, publishes them in one pipelined round trip
and settles them before it commits: published rows are deleted, failed ones
rescheduled with backoff or dead-lettered. The row locks are the claim; if
anything escapes before the settlement commits, the transaction rolls back and
the rows are due again (recovery reads the batch's journal row).

A row is judged alone: whatever building its entry raises (a payload nested
deeper than the JSON decoder recurses, a broken trace context) fails that row
like a failed publish, with the error, and the rest of the batch publishes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.models import payload_fields
from dispatcher.outbox import metrics
from dispatcher.outbox.backpressure import RedisMemoryGate
from dispatcher.outbox.outcomes import ClaimedRow, Outcomes, plan_outcomes
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.naming import route_stream
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import InvalidShardCount, LiveShardCount
from dispatcher.tracing import child_span

__all__ = ["FALLBACK_STREAM", "BatchPipeline", "BatchSettings", "target_stream"]

log = logging.getLogger(__name__)

FALLBACK_STREAM = "workflow.tasks"

Entry = tuple[str, dict[str, str]]


def target_stream(row: ClaimedRow, shards: int) -> str:
    """The stream a claimed row is published to at ``shards``: the one place that decides it.

    A row without a task id (written by hand) still spreads, by its own id.
    """
    return route_stream(row.stream or FALLBACK_STREAM, row.task_id or row.id, shards)


@dataclass(frozen=True, slots=True)
class BatchSettings:
    batch_size: int = 100
    # The longest the batch's transaction may sit idle before PostgreSQL ends it.
    hold_for: float = 30.0
    publish_timeout: float = 10.0
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000


class BatchPipeline:
    """Runs batches; ``run()`` is one of them, start to end.

    ``shard_count`` is the count rows are routed by when published (by default
    read live from the publisher's Redis). ``memory`` is told what each batch
    published and when Redis refused it for lack of memory.
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        settings: BatchSettings = BatchSettings(),
        shard_count: LiveShardCount | None = None,
        memory: RedisMemoryGate | None = None,
    ) -> None:
        self.settings = settings
        self._repo = repository
        self._publisher = publisher
        self._shards = shard_count or LiveShardCount(publisher.client)
        self._memory = memory

    async def run(self, *, probe: bool = False) -> int:
        """Lock, publish and settle one batch; return how many rows it held.

        With ``probe``, the batch is one suspect row alone (see the repository).
        """
        s = self.settings
        async with self._repo.claim_batch(s.batch_size, hold_for=s.hold_for, probe=probe) as batch:
            if not batch.rows:
                return 0
            rows = batch.rows
            metrics.IN_FLIGHT.inc(len(rows))
            try:
                with contextlib.ExitStack() as spans:
                    results = await self._publish(rows, spans)
                outcomes = plan_outcomes(rows, results)
                if self._memory is not None:
                    self._memory.published(sum(len(r.payload or "") for r in rows), len(rows))
                    if outcomes.held:
                        self._memory.refused()
                try:
                    await batch.settle(outcomes.sent, outcomes.retry, outcomes.dead)
                except BaseException:
                    metrics.UNSETTLED.inc()
                    log.error(
                        "could not settle a batch of %d rows (%d published): they stay in the "
                        "outbox and are published again",
                        len(rows),
                        len(outcomes.sent),
                    )
                    raise
            finally:
                metrics.IN_FLIGHT.dec(len(rows))
        _report(rows, outcomes)
        metrics.BATCHES.inc()
        return len(rows)

    async def _publish(
        self, rows: list[ClaimedRow], spans: contextlib.ExitStack
    ) -> list[PublishResult]:
        """One result per row, in order: rows that could not be encoded fail alone."""
        try:
            timeout = self.settings.publish_timeout
            shards = await asyncio.wait_for(self._shards.current(), timeout)
        except (TimeoutError, RedisError, OSError, InvalidShardCount) as exc:
            return [PublishResult(stream=r.stream, error=exc) for r in rows]  # retried
        results: list[PublishResult | None] = []
        entries: list[Entry] = []
        for row in rows:
            try:
                entries.append(_traced(_entry(row, shards), spans))
                results.append(None)
            except Exception as exc:
                log.error("outbox row %s cannot be published: %s", row.id, _short(exc))
                results.append(PublishResult(stream=row.stream, error=exc))
        started = time.monotonic()
        sent = iter(await self._publish_entries(entries) if entries else [])
        elapsed = time.monotonic() - started
        merged = [r if r is not None else next(sent) for r in results]
        for row, result in zip(rows, merged, strict=True):
            if result.ok:
                metrics.COMMIT_TO_PUBLISH.observe(row.age_seconds + elapsed)
        return merged

    async def _publish_entries(self, entries: list[Entry]) -> list[PublishResult]:
        s = self.settings
        started = time.monotonic()
        try:
            results = await asyncio.wait_for(
                self._publisher.publish_many(
                    entries, wait_replicas=s.wait_replicas, wait_timeout_ms=s.wait_timeout_ms
                ),
                s.publish_timeout,
            )
        except (TimeoutError, RedisError, OSError) as exc:
            results = [PublishResult(stream=stream, error=exc) for stream, _ in entries]
        metrics.PUBLISH_LATENCY.observe(time.monotonic() - started)
        return results


def _entry(row: ClaimedRow, shards: int) -> Entry:
    return target_stream(row, shards), payload_fields(row.payload, row.id)


def _traced(entry: Entry, spans: contextlib.ExitStack) -> Entry:
    """An entry that carries a trace gets a publish span; its context replaces the entry's."""
    stream, fields = entry
    if "traceparent" not in fields:
        return entry
    attributes = {"messaging.destination.name": stream}
    own = spans.enter_context(child_span(fields, "outbox publish", kind="PRODUCER", **attributes))
    return stream, {**fields, **own}


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


def _report(rows: list[ClaimedRow], outcomes: Outcomes) -> None:
    streams = {r.id: r.stream for r in rows}
    for counter, ids in (
        (metrics.PROCESSED, outcomes.sent),
        (metrics.FAILED, [r.id for r in outcomes.retry]),
        (metrics.DLQ, [r.id for r in outcomes.dead]),
    ):
        for queue, n in collections.Counter(metrics.queue_label(streams[i]) for i in ids).items():
            counter.labels(queue).inc(n)
    if outcomes.held:
        log.warning(
            "Redis is full (OOM): %d rows stay PENDING, no attempt counted", len(outcomes.held)
        )
    if outcomes.retry:
        log.warning(
            "publish failed for %d rows; retrying with backoff: %s",
            len(outcomes.retry),
            outcomes.retry[0].error,
        )
    if outcomes.dead:
        log.error(
            "%d rows exhausted their retries and moved to outbox_dlq: %s",
            len(outcomes.dead),
            outcomes.dead[0].error,
        )
