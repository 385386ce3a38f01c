"""The outbox enqueuer: committed outbox rows -> Redis stream entries, then deleted.

The loop runs claim batches with bounded concurrency. While batches come back
full (a backlog) it keeps every slot busy; otherwise it waits for whichever
comes first: a wake-up from the LISTEN connection or the poll interval
(retries coming due, lost notifications).

NOTIFY is not free: it serialises the commits of every transaction that sends
it. So the trigger notifies only while some enqueuer holds the idle flag, an
advisory lock on its own session (migration 0005). An enqueuer drops the flag
as soon as one claim finds several rows (commits arrive faster than it wakes:
notifications would only slow them down); then, while batches come back
partial, it claims again after ``linger`` so a steady stream of commits goes
out a batch at a time, and while they come back full, at once. It takes the
flag again after two empty claims a few milliseconds apart, and claims once
more right away: every transaction that inserted without a NOTIFY held the
flag's lock shared until it ended, so that claim sees its rows. The poll
interval stays the backstop.

A batch is one transaction: it locks due rows (FOR UPDATE SKIP LOCKED),
publishes them in one pipelined round trip and settles them before it
commits: published rows are deleted, failed ones rescheduled with backoff or
dead-lettered. The row locks are the claim. An enqueuer that crashes loses
its session and PostgreSQL rolls the batch back; one that pauses past
``recover_in_flight_after`` is cut off by ``idle_in_transaction_session_timeout``
and, when it wakes, has no transaction left to write with. Either way the rows
are simply due again. Each batch is journalled (``outbox_batches``) so the
maintenance loop counts an attempt for the rows of a batch that never settled:
a row that keeps killing enqueuers still reaches the DLQ.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from dispatcher.models import payload_fields
from dispatcher.outbox import metrics
from dispatcher.outbox.backoff import ClaimedRow, Outcomes, plan_outcomes
from dispatcher.outbox.listener import OutboxListener
from dispatcher.outbox.repository import STATUSES, OutboxRepository
from dispatcher.stream.naming import route_stream
from dispatcher.stream.protocol import PublishResult
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shards import InvalidShardCount, LiveShardCount
from dispatcher.tracing import child_span

__all__ = ["EnqueuerConfig", "OutboxEnqueuer"]

log = logging.getLogger(__name__)

FALLBACK_STREAM = "workflow.tasks"


@dataclass(frozen=True, slots=True)
class EnqueuerConfig:
    batch_size: int = 100
    concurrency: int = 4
    poll_interval: float = 1.0
    # A batch's transaction idle longer than this (a paused or hung enqueuer) is ended by
    # PostgreSQL and its rows are due again.
    recover_in_flight_after: float = 30.0
    maintenance_interval: float = 30.0
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    publish_timeout: float = 10.0
    shutdown_timeout: float = 30.0
    listener_rotate_after: float = 600.0
    # Withdraw the idle announcement when one claim finds at least this many rows.
    busy_at_rows: int = 2
    # An empty claim is confirmed by a second one, started at least this many seconds after
    # the first ended, before announcing (concurrent empty claims do not confirm each other).
    idle_confirm_after: float = 0.005
    # A claim that found rows but not a full batch, with nobody announced idle: wait this long
    # before the next claim, so rows arriving at a steady rate go out in batches (a few rows
    # per transaction would spend the database's CPU on the enqueuer instead of the
    # application). Full batches (a backlog) go again at once.
    linger: float = 0.002

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.concurrency < 1:
            raise ValueError("batch size and concurrency must be >= 1")
        if self.poll_interval <= 0 or self.maintenance_interval <= 0:
            raise ValueError("poll and maintenance intervals must be > 0")
        if self.recover_in_flight_after <= self.publish_timeout:  # it bounds WAIT too
            raise ValueError(
                "recover-in-flight-after must exceed the publish timeout "
                f"({self.publish_timeout:g} s), or PostgreSQL would end batches still publishing"
            )


class OutboxEnqueuer:
    """Drains the outbox into Redis Streams until ``request_stop()``.

    ``listen_conninfo`` enables the LISTEN wake-up; without it the enqueuer
    only polls. ``shard_count`` is the count rows are routed by when published
    (by default read live from the publisher's Redis).
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        config: EnqueuerConfig = EnqueuerConfig(),
        listen_conninfo: str | None = None,
        shard_count: LiveShardCount | None = None,
    ) -> None:
        self.config = config
        self._repo = repository
        self._publisher = publisher
        self._shards = shard_count or LiveShardCount(publisher.client)
        self._kick = asyncio.Event()
        self._stopping = False
        self._backlog = False
        self._quiet_since: float | None = None  # end of the first empty claim in a row
        self._flag_retry = config.idle_confirm_after  # backoff while the flag cannot be taken
        self._idle_lock = asyncio.Lock()
        self.last_loop = time.monotonic()
        self.listener = (
            OutboxListener(
                conninfo=listen_conninfo,
                wake=self.wake,
                rotate_after=config.listener_rotate_after,
                on_state=self._listener_state,
            )
            if listen_conninfo
            else None
        )

    def wake(self) -> None:
        """Ask the loop to claim now; any number of calls collapse into one wake-up."""
        self._kick.set()

    def request_stop(self) -> None:
        """Stop claiming; in-flight batches finish (bounded by ``shutdown_timeout``)."""
        self._stopping = True
        self._kick.set()

    async def run(self) -> None:
        log.info(
            "outbox enqueuer starting",
            extra={"batch_size": self.config.batch_size, "concurrency": self.config.concurrency},
        )
        first_pass = asyncio.Event()
        helpers = [
            asyncio.create_task(self._maintenance_loop(first_pass), name="outbox-maintenance")
        ]
        if self.listener:
            helpers.append(asyncio.create_task(self.listener.run(), name="outbox-listener"))
        batches: set[asyncio.Task[int]] = set()
        try:
            await first_pass.wait()  # count the attempts of batches a crash left before claiming
            await self._main_loop(batches)
        finally:
            await self._drain(batches)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._repo.aclose()
            log.info("outbox enqueuer stopped")

    async def _main_loop(self, batches: set[asyncio.Task[int]]) -> None:
        slots = asyncio.Semaphore(self.config.concurrency)
        while not self._stopping:
            await slots.acquire()
            if self._stopping:
                slots.release()
                break
            task = asyncio.create_task(self._batch_in_slot(slots))
            batches.add(task)
            task.add_done_callback(batches.discard)
            self.last_loop = time.monotonic()
            if self._backlog:
                continue  # the last batch was full: fill every free slot at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.config.poll_interval)
            self._kick.clear()

    async def _batch_in_slot(self, slots: asyncio.Semaphore) -> int:
        started = asyncio.get_running_loop().time()
        try:
            count = await self.process_batch()
        except Exception:
            log.exception("outbox batch failed; its rows are retried or recovered")
            count = 0
        finally:
            slots.release()
        try:
            await self._after_batch(count, started)
        except Exception as exc:
            log.warning("could not update the idle announcement: %s", exc)
        return count

    @property
    def idle_announced(self) -> bool:
        """True while this enqueuer holds the idle flag: outbox inserts NOTIFY."""
        return self._repo.idle_flag_held

    async def _after_batch(self, count: int, started: float) -> None:
        """Decide when to claim again, and whether inserts should NOTIFY us."""
        loop = asyncio.get_running_loop()
        if count:
            self._quiet_since = None
            self._flag_retry = self.config.idle_confirm_after
        async with self._idle_lock:
            if self.idle_announced and count >= self.config.busy_at_rows:
                await self._repo.drop_idle_flag()
            elif count == 0 and not self.idle_announced and self._can_listen():
                await self._confirm_idle(started, loop.time())
        self._backlog = count >= self.config.batch_size
        if self._backlog:
            self._kick.set()  # a full batch: more are waiting
        elif count and not self.idle_announced:
            # No NOTIFY will come for the next rows: claim again shortly, in one batch.
            loop.call_later(self.config.linger, self.wake)

    async def _confirm_idle(self, started: float, ended: float) -> None:
        loop = asyncio.get_running_loop()
        quiet_since = self._quiet_since
        if quiet_since is None or started < quiet_since + self.config.idle_confirm_after:
            if quiet_since is None:
                self._quiet_since = ended
            loop.call_later(self.config.idle_confirm_after, self.wake)
            return
        if await self._repo.take_idle_flag():
            metrics.IDLE_ANNOUNCED.inc()
            self._flag_retry = self.config.idle_confirm_after
            # Rows committed before the flag was taken sent no NOTIFY, but their transactions
            # have ended (they held the flag's lock shared): one claim now sees them all.
            self.wake()
        else:
            # Another enqueuer holds it (its NOTIFYs wake us too), or an insert is in flight.
            loop.call_later(self._flag_retry, self.wake)
            self._flag_retry = min(self._flag_retry * 2, self.config.poll_interval)

    def _can_listen(self) -> bool:
        return bool(self.listener and self.listener.connected and not self._stopping)

    def _listener_state(self, connected: bool) -> None:
        metrics.LISTENER_CONNECTED.set(1 if connected else 0)
        if not connected and self.idle_announced:
            # Nobody hears NOTIFY now; the poll takes over.
            asyncio.get_running_loop().create_task(self._withdraw_quietly())

    async def _withdraw_quietly(self) -> None:
        with contextlib.suppress(Exception):
            async with self._idle_lock:
                await self._repo.drop_idle_flag()

    async def _drain(self, batches: set[asyncio.Task[int]]) -> None:
        """Let running batches finish; past the timeout cancel them (their rows roll back)."""
        if batches:
            _, late = await asyncio.wait(batches, timeout=self.config.shutdown_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            if late:
                log.warning("cancelled %d unfinished batches at shutdown", len(late))
        await self._withdraw_quietly()

    async def process_batch(self) -> int:
        """Lock, publish and settle one batch; return how many rows it held.

        The rows stay locked by the batch's transaction until ``settle``
        commits: if anything fails before that, the transaction rolls back and
        the rows are due again (recovery counts the attempt from the journal).
        """
        hold_for = self.config.recover_in_flight_after
        async with self._repo.lock_batch(self.config.batch_size, hold_for=hold_for) as batch:
            if not batch.rows:
                return 0
            rows = batch.rows
            metrics.IN_FLIGHT.inc(len(rows))
            try:
                results = await self._publish(rows)
                outcomes = plan_outcomes(rows, results)
                try:
                    await batch.settle(outcomes.sent, outcomes.retry, outcomes.dead)
                except BaseException:
                    metrics.UNSETTLED.inc()
                    log.error(
                        "could not settle a batch of %d rows (%d published): they stay in the "
                        "outbox and are published again; recovery counts the attempt",
                        len(rows),
                        len(outcomes.sent),
                    )
                    raise
            finally:
                metrics.IN_FLIGHT.dec(len(rows))
        self._report(rows, outcomes)
        metrics.BATCHES.inc()
        return len(rows)

    async def _publish(self, rows: list[ClaimedRow]) -> list[PublishResult]:
        try:
            shards = await asyncio.wait_for(self._shards.current(), self.config.publish_timeout)
        except (TimeoutError, RedisError, OSError, InvalidShardCount) as exc:
            return [PublishResult(stream=r.stream, error=exc) for r in rows]  # retried
        entries = [
            (
                # A row without a task id (written by hand) still spreads, by its own id.
                route_stream(r.stream or FALLBACK_STREAM, r.task_id or r.id, shards),
                payload_fields(r.payload, r.id),
            )
            for r in rows
        ]
        with contextlib.ExitStack() as spans:
            return await self._publish_entries(rows, self._traced(entries, spans))

    @staticmethod
    def _traced(
        entries: list[tuple[str, dict[str, str]]], spans: contextlib.ExitStack
    ) -> list[tuple[str, dict[str, str]]]:
        """Entries that carry a trace get a publish span; its context replaces theirs."""
        out = []
        for stream, fields in entries:
            if "traceparent" in fields:
                attributes = {"messaging.destination.name": stream}
                span = child_span(fields, "outbox publish", kind="PRODUCER", **attributes)
                own = spans.enter_context(span)
                fields = {**fields, **own}
            out.append((stream, fields))
        return out

    async def _publish_entries(
        self, rows: list[ClaimedRow], entries: list[tuple[str, dict[str, str]]]
    ) -> list[PublishResult]:
        started = time.monotonic()
        try:
            results = await asyncio.wait_for(
                self._publisher.publish_many(
                    entries,
                    wait_replicas=self.config.wait_replicas,
                    wait_timeout_ms=self.config.wait_timeout_ms,
                ),
                self.config.publish_timeout,
            )
        except (TimeoutError, RedisError, OSError) as exc:
            results = [PublishResult(stream=s, error=exc) for s, _ in entries]
        elapsed = time.monotonic() - started
        metrics.PUBLISH_LATENCY.observe(elapsed)
        for row, result in zip(rows, results, strict=True):
            if result.ok:
                metrics.COMMIT_TO_PUBLISH.observe(row.age_seconds + elapsed)
        return results

    @staticmethod
    def _report(rows: list[ClaimedRow], outcomes: Outcomes) -> None:
        streams = {r.id: r.stream for r in rows}
        for counter, ids in (
            (metrics.PROCESSED, outcomes.sent),
            (metrics.FAILED, [r.id for r in outcomes.retry]),
            (metrics.DLQ, [r.id for r in outcomes.dead]),
        ):
            for queue, n in collections.Counter(
                metrics.queue_label(streams[i]) for i in ids
            ).items():
                counter.labels(queue).inc(n)
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

    async def _maintenance_loop(self, first_pass: asyncio.Event) -> None:
        while True:
            try:
                await self.maintenance_once()
            except Exception as exc:
                log.error("outbox maintenance failed: %s", exc, exc_info=True)
            first_pass.set()
            await asyncio.sleep(self.config.maintenance_interval)

    async def maintenance_once(self) -> dict[str, Any]:
        """Count the attempts of batches that never settled; refresh the depth gauges."""
        if not await self._repo.check_idle_flag() and self._can_listen():
            self.wake()  # the flag died with its session: an empty claim takes it again
        retried, dead = await self._repo.recover_batches()
        if retried or dead:
            metrics.RECOVERED.labels("retry").inc(retried)
            metrics.RECOVERED.labels("dlq").inc(dead)
            log.warning(
                "counted an attempt for rows of batches that did not settle",
                extra={"retried": retried, "dead_lettered": dead},
            )
            self.wake()
        counts = await self._repo.status_counts()
        for status in STATUSES:
            metrics.OUTBOX_DEPTH.labels(status).set(counts.by_status.get(status, 0))
        metrics.OUTBOX_DEPTH.labels("IN_FLIGHT").set(counts.in_flight)
        return {"retried": retried, "dead": dead}
