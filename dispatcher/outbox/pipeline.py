"""One batch from claim to report: claim -> publish -> settle -> report.

A batch is one transaction: it locks due rows (FOR UPDATE SKIP LOCKED), each
row is routed and packed as an XADD command (``encoding``), they go to Redis
in one write (per node) and are settled before the transaction commits:
published rows are deleted, failed ones rescheduled with backoff or
dead-lettered. No per-row object is made for a batch that publishes whole. The
row locks are the claim; if anything escapes before the settlement commits,
the transaction rolls back and the rows are due again (recovery reads the
batch's journal row).

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
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import RedisError

from dispatcher.outage import Outage, is_outage
from dispatcher.outbox.backpressure import RedisMemoryGate
from dispatcher.outbox.claim import ClaimedBatch
from dispatcher.outbox.encoding import encode_batch
from dispatcher.outbox.metrics import EnqueuerMetrics, observe_ages
from dispatcher.outbox.outcomes import Outcomes, plan_outcomes
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import InvalidShardCount, LiveShardCount

__all__ = ["BatchPipeline", "BatchRun", "BatchSettings"]

T = TypeVar("T")

log = logging.getLogger(__name__)


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
    published and when Redis refused it for lack of memory. ``metrics`` is the
    enqueuer's, updated for every batch; ``outage`` too, where Redis being down is said.
    A ``BatchRun`` (``claimed``) takes its steps through ``send_batch``, ``shard_count``,
    ``claims``, ``memory`` and ``metrics``.
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        metrics: EnqueuerMetrics,
        settings: BatchSettings = BatchSettings(),
        shard_count: LiveShardCount | None = None,
        memory: RedisMemoryGate | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.settings = settings
        self.claims = repository.claims
        self._publisher = publisher
        self._outage = outage or Outage("Redis")
        self._shards = shard_count or LiveShardCount(publisher.client, outage=self._outage)
        self.memory = memory
        self.metrics = metrics

    async def run(self, *, probe: bool = False) -> int:
        """Claim, publish and settle one batch; how many rows it held.

        With ``probe``, the batch is one suspect row alone (``BatchClaims.claim_batch``).
        """
        async with self.claimed(probe=probe) as run:
            if len(run):
                await run.publish()
                await run.settle()
            return len(run)

    @contextlib.asynccontextmanager
    async def claimed(self, *, probe: bool = False) -> AsyncIterator[BatchRun]:
        """A batch claimed for the block (and those later claimed in its settlements), on one
        connection; whatever is not settled when the block ends rolls back."""
        shards = await self.shard_count()  # read before the rows are locked
        s = self.settings
        async with self.claims.claim_batch(s.batch_size, hold_for=s.hold_for, probe=probe) as batch:
            run = BatchRun(self, batch, shards)
            try:
                yield run
            finally:
                run.close()

    async def shard_count(self) -> tuple[int, BaseException | None]:
        """The live shard count, or the error that every row of the batch then fails with."""
        fresh = self._shards.fresh()
        if fresh is not None:  # read lately: no await, no task (wait_for makes one)
            return fresh, None
        try:
            async with asyncio.timeout(self.settings.publish_timeout):
                return await self._shards.current(), None
        except (TimeoutError, RedisError, OSError, InvalidShardCount) as exc:
            self._outage.failed(exc, what="reading the shard count")
            return 1, exc  # retried

    async def send_batch(
        self,
        batch: ClaimedBatch,
        shards: int,
        unknown: BaseException | None,
        spans: contextlib.ExitStack,
    ) -> tuple[list[Any], int]:
        """One reply per row, in order (an entry id, or the error the row failed with).

        And the size of the commands written (characters), for the memory gate.
        """
        if unknown is not None:
            return [unknown] * len(batch), 0
        encoded = encode_batch(batch, shards, spans)
        streams, commands, failed = encoded.streams, encoded.commands, encoded.failed
        started = time.monotonic()
        if not failed:
            replies = await self._send(streams, commands)
        else:
            todo = [i for i in range(len(batch)) if i not in failed]
            sent = iter(await self._send([streams[i] for i in todo], [commands[i] for i in todo]))
            replies = [failed[i] if i in failed else next(sent) for i in range(len(batch))]
        elapsed = time.monotonic() - started
        ages = batch.column("age_seconds")
        if failed or any(isinstance(reply, BaseException) for reply in replies):
            ages = [
                a for a, r in zip(ages, replies, strict=True) if not isinstance(r, BaseException)
            ]
        observe_ages(self.metrics.commit_to_publish, ages, plus=elapsed)
        batch.targets = streams
        return replies, sum(map(len, commands))

    async def _send(self, streams: list[str], commands: list[bytes]) -> list[Any]:
        s = self.settings
        started = time.monotonic()
        try:
            # A timeout scope, not wait_for: no task of its own, one turn of the loop less.
            async with asyncio.timeout(s.publish_timeout):
                replies = await self._publisher.publish_packed(
                    streams,
                    commands,
                    wait_replicas=s.wait_replicas,
                    wait_timeout_ms=s.wait_timeout_ms,
                )
        except (TimeoutError, RedisError, OSError) as exc:
            replies = [exc] * len(commands)
        # A reply that is an error may be a connection's (the pipeline returns, not raises).
        lost = next((r for r in replies if isinstance(r, BaseException) and is_outage(r)), None)
        if lost is None:
            self._outage.ok()
        else:
            self._outage.failed(lost, what="publishing")
        self.metrics.publish_latency.observe(time.monotonic() - started)
        return replies


class BatchRun:
    """The batch in hand on one connection, read top to bottom by its caller: ``publish``,
    then ``settle``, or (a full batch that published whole, while a backlog lasts)
    ``settle_and_claim_next``, which makes the next batch the one in hand.

    Each settlement is reported (metrics, log lines) once it committed; the rows of a batch
    published but not settled count as in flight until it ends.
    """

    def __init__(
        self, pipeline: BatchPipeline, batch: ClaimedBatch, shards: tuple[int, BaseException | None]
    ) -> None:
        self._pipeline = pipeline
        self._batch = batch
        self._shards = shards
        self._outcomes: Outcomes | None = None
        self._replies: list[Any] = []
        self._in_flight = 0

    def __len__(self) -> int:
        return len(self._batch)

    @property
    def whole(self) -> bool:
        """Published, full, and every row sent: the next batch may be claimed in its settlement."""
        outcomes = self._outcomes
        size = len(self._batch)
        return (
            outcomes is not None
            and size >= self._pipeline.settings.batch_size
            and len(outcomes.sent) == size
        )

    async def publish(self) -> None:
        """Route, pack and publish the batch in hand; what became of each row is kept."""
        pipeline, batch = self._pipeline, self._batch
        size = len(batch)
        pipeline.metrics.in_flight.inc(size)
        self._in_flight = size
        shards, unknown = self._shards
        with contextlib.ExitStack() as spans:
            self._replies, packed = await pipeline.send_batch(batch, shards, unknown, spans)
        self._outcomes = outcomes = _outcomes(batch, self._replies)
        if pipeline.memory is not None:
            pipeline.memory.published(packed, size)
            if outcomes.held:
                pipeline.memory.refused()

    async def settle(self) -> None:
        """Delete, reschedule and dead-letter the batch's rows and commit; then report it."""
        outcomes = self._published()
        await self._settling(self._batch.settle(outcomes.sent, outcomes.retry, outcomes.dead))
        self._report()

    async def settle_and_claim_next(self) -> bool:
        """Settle the batch (published whole) and claim the next in the same round trip; False
        if none could be claimed (the batch is settled all the same). The next batch, which may
        hold no row, is then the one in hand."""
        self._published()
        pipeline = self._pipeline
        following = await self._settling(
            pipeline.claims.claim_next(
                self._batch, pipeline.settings.batch_size, hold_for=pipeline.settings.hold_for
            )
        )
        self._report()
        if following is None:
            return False
        self._batch, self._outcomes, self._replies = following, None, []
        self._shards = await pipeline.shard_count()  # as the count is now
        return True

    def close(self) -> None:
        """The batch in hand is no longer in flight: settled, or ended unsettled (an error, a
        cancellation)."""
        self._pipeline.metrics.in_flight.dec(self._in_flight)
        self._in_flight = 0

    def _published(self) -> Outcomes:
        if self._outcomes is None:
            raise RuntimeError("a batch is published before it is settled")
        return self._outcomes

    async def _settling(self, settlement: Awaitable[T]) -> T:
        try:
            return await settlement
        except BaseException:
            self._pipeline.metrics.unsettled.inc()
            log.error(
                "could not settle a batch of %d rows (%d published): they stay in the "
                "outbox and are published again",
                len(self._batch),
                len(self._published().sent),
            )
            raise

    def _report(self) -> None:
        metrics = self._pipeline.metrics
        self.close()
        _report(self._batch, self._published(), metrics=metrics, outage=_outage_only(self._replies))
        metrics.batches.inc()


def _outcomes(batch: ClaimedBatch, replies: list[Any]) -> Outcomes:
    if not any(isinstance(reply, BaseException) for reply in replies):
        return Outcomes(sent=batch.ids)  # the common case, without an object per row
    results = [
        PublishResult(stream=target, error=reply)
        if isinstance(reply, BaseException)
        else PublishResult(stream=target, entry_id=str(reply))
        for target, reply in zip(batch.targets or batch.column("stream"), replies, strict=True)
    ]
    return plan_outcomes(batch.rows, results)


def _outage_only(replies: list[Any]) -> bool:
    """Every row that failed, failed as Redis was unreachable (the outage said so once)."""
    errors = [r for r in replies if isinstance(r, BaseException)]
    return bool(errors) and all(map(is_outage, errors))


def _report(
    batch: ClaimedBatch, outcomes: Outcomes, *, metrics: EnqueuerMetrics, outage: bool = False
) -> None:
    if len(outcomes.sent) == len(batch):
        metrics.count(metrics.processed, collections.Counter(batch.column("stream")))
    else:
        streams = dict(zip(batch.ids, batch.column("stream"), strict=True))
        for counter, ids in (
            (metrics.processed, outcomes.sent),
            (metrics.failed, [r.id for r in outcomes.retry]),
            (metrics.dlq, [r.id for r in outcomes.dead]),
        ):
            metrics.count(counter, collections.Counter(streams[i] for i in ids))
    if outcomes.held:
        log.warning(
            "Redis is full (OOM): %d rows stay PENDING, no attempt counted", len(outcomes.held)
        )
    if outcomes.retry:
        log.log(
            logging.DEBUG if outage else logging.WARNING,
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
