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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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

__all__ = ["BatchPipeline", "BatchSettings", "More"]

# Asked after a full batch published whole: whether to claim the next one in its settlement.
More = Callable[[int], Awaitable[bool]]

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
        self._repo = repository
        self._publisher = publisher
        self._outage = outage or Outage("Redis")
        self._shards = shard_count or LiveShardCount(publisher.client, outage=self._outage)
        self._memory = memory
        self._metrics = metrics

    async def run(self, *, probe: bool = False, more: More | None = None) -> int:
        """Claim, publish and settle a batch; return how many rows the last one held.

        With ``probe``, the batch is one suspect row alone (``BatchClaims.claim_batch``).

        With ``more``, a full batch that published whole asks it whether to claim
        the next batch right away (``more(rows)``). Yes settles the batch and
        claims the next in one round trip (``BatchClaims.claim_next``), on
        the same connection; ``more`` is then
        the report of the batch it was asked about, and the return value is the
        size of the last batch, which it was not asked about.
        """
        s = self.settings
        shards, unknown = await self._shard_count()  # read before the rows are locked
        claim = self._repo.claims.claim_batch(
            s.batch_size,
            hold_for=s.hold_for,
            probe=probe,
        )
        async with claim as batch:
            while True:
                size = len(batch)
                if not size:
                    return 0
                following = await self._publish_and_settle(
                    batch, shards, unknown, None if probe else more
                )
                if following is None:
                    return size
                batch = following
                shards, unknown = await self._shard_count()  # as the count is now

    async def _publish_and_settle(
        self,
        batch: ClaimedBatch,
        shards: int,
        unknown: BaseException | None,
        more: More | None,
    ) -> ClaimedBatch | None:
        """Publish and settle ``batch``; the batch claimed in its settlement, if ``more`` said."""
        size = len(batch)
        following: ClaimedBatch | None = None
        self._metrics.in_flight.inc(size)
        try:
            with contextlib.ExitStack() as spans:
                replies, packed = await self._publish(batch, shards, unknown, spans)
            outcomes = _outcomes(batch, replies)
            if self._memory is not None:
                self._memory.published(packed, size)
                if outcomes.held:
                    self._memory.refused()
            chain = False
            if more is not None and size >= self.settings.batch_size and len(outcomes.sent) == size:
                try:
                    chain = await more(size)
                except Exception:  # the batch published: it settles, whatever the answer
                    log.exception("could not decide on claiming the next batch; settling this one")
            try:
                if not chain:
                    await batch.settle(outcomes.sent, outcomes.retry, outcomes.dead)
                else:
                    following = await self._repo.claims.claim_next(
                        batch,
                        self.settings.batch_size,
                        hold_for=self.settings.hold_for,
                    )
            except BaseException:
                self._metrics.unsettled.inc()
                log.error(
                    "could not settle a batch of %d rows (%d published): they stay in the "
                    "outbox and are published again",
                    size,
                    len(outcomes.sent),
                )
                raise
        finally:
            self._metrics.in_flight.dec(size)
        _report(batch, outcomes, metrics=self._metrics, outage=_outage_only(replies))
        self._metrics.batches.inc()
        return following

    async def _shard_count(self) -> tuple[int, BaseException | None]:
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

    async def _publish(
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
        observe_ages(self._metrics.commit_to_publish, ages, plus=elapsed)
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
        self._metrics.publish_latency.observe(time.monotonic() - started)
        return replies


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
