"""The idle path: rows published straight from their notifications, deleted after.

While this enqueuer holds the idle flag, every committed outbox row that is
due and small enough arrives in its NOTIFY payload (``parse_notification``
reads it). The listener hands over the notifications of one read and awaits
``publish_received`` in its own task: no turn of the event loop between the
read and the XADD, and notifications that arrive meanwhile are read next and go
out together, as one pipelined publish. Rows are routed and encoded by the
same functions as a claim batch (``encode_rows``), so an entry is the same
whichever path sends it. While a publish waits on Redis (at most the publish
timeout) the listener reads nothing; the claim path's poll still runs. The
published rows are deleted afterwards in one statement, off the latency path;
``InFlight`` keeps this process's claims away from them until then.

Nothing here charges an attempt. A row this path cannot publish is left as
it was and handed to the claim path, which owns retries, row isolation and
the DLQ: at once for any failure (an error of the row's own, too few replicas,
Redis not answering), and through the memory gate when Redis is full (a
full Redis is not the row's fault: the gate holds the claim path, nothing is
charged).

A crash between the XADD and the delete leaves the row to be claimed and
published again: a duplicate the workers suppress by its dedup key.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from redis.exceptions import RedisError

from dispatcher.outbox.backpressure import RedisMemoryGate
from dispatcher.outbox.encoding import encode_rows
from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.metrics import EnqueuerMetrics, queue_label
from dispatcher.outbox.outcomes import ClaimedRow, is_out_of_memory
from dispatcher.outbox.pipeline import BatchSettings, publish_entries
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import InvalidShardCount, LiveShardCount

__all__ = ["NotifiedRows", "parse_notification"]

log = logging.getLogger(__name__)

# Deletes that failed are tried again after this, doubling up to the maximum.
_DELETE_RETRY = 0.05
_DELETE_RETRY_MAX = 5.0


def parse_notification(message: str) -> ClaimedRow | None:
    """The row a notification carries, or None for a plain wake-up.

    The trigger sends ``[id, stream, task_id]`` as JSON, then, if the row has
    a payload, a newline and the payload's text.
    """
    if not message:
        return None
    header, newline, payload = message.partition("\n")
    row_id, stream, task_id = json.loads(header)
    if not isinstance(row_id, str) or not isinstance(stream, str):
        raise ValueError("a row notification names its id and stream")
    return ClaimedRow(
        id=row_id,
        stream=stream,
        payload=payload if newline else None,
        attempt_count=0,
        max_retries=0,
        backoff_seconds=0,
        age_seconds=0.0,
        task_id=task_id if isinstance(task_id, str) else None,
    )


class NotifiedRows:
    """Publishes the flag holder's notified rows; ``receive`` takes each notification.

    ``wake`` asks the claim path to claim now; ``published(count, started)``
    reports each publish to the scheduler (the idle flag decides on it as on
    a claim) before the next one starts.
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        settings: BatchSettings,
        flag: IdleFlag,
        inflight: InFlight,
        shard_count: LiveShardCount,
        memory: RedisMemoryGate,
        metrics: EnqueuerMetrics,
        wake: Callable[[], None],
        published: Callable[[int, float], Awaitable[None]],
    ) -> None:
        self._repo = repository
        self._publisher = publisher
        self._settings = settings
        self._flag = flag
        self._inflight = inflight
        self._shards = shard_count
        self._memory = memory
        self._metrics = metrics
        self._wake = wake
        self._published = published
        self._queued: list[ClaimedRow] = []
        self._to_delete: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed_batches = 0

    def receive(self, message: str) -> None:
        """One notification: a row to publish (``publish_received``), or a wake-up."""
        try:
            row = parse_notification(message)
        except ValueError as exc:  # not ours to read: the claim finds the row anyway
            log.warning("unreadable outbox notification (%s); claiming instead", exc)
            row = None
        if row is None:
            self._wake()
            return
        self._queued.append(row)

    async def publish_received(self) -> None:
        """Publish the rows received so far, in the caller's task (the listener's).

        The listener awaits this after each read, so a row goes out without a
        turn of the event loop; rows that arrive meanwhile are read next, and
        go out together.
        """
        if not self._queued:
            return
        try:
            await self._publish_queued()
        except Exception:
            log.exception("publishing notified rows failed; the claim path takes them")
            self._wake()

    async def aclose(self) -> None:
        """Finish the deletes on their way; cancelled, drop the rest.

        Rows published but not deleted then stay in the outbox and go out again.
        """
        try:
            task = self._tasks.get("delete")
            if task is not None:
                await asyncio.wait({task})
        finally:
            for task in list(self._tasks.values()):
                task.cancel()

    def _start(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        if name not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._run(name, work))
            self._tasks[name] = task

    async def _run(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception:
            log.exception("the notified rows' %s failed; the claim path takes them", name)
            self._wake()
        finally:
            del self._tasks[name]

    async def _publish_queued(self) -> None:
        size = self._settings.batch_size
        while self._queued:
            rows, self._queued = self._queued[:size], self._queued[size:]
            if not self._flag.held or self._memory.paused:
                self._wake()  # for the claim path (which the memory gate holds back)
                continue
            rows = self._inflight.notify(rows)
            if rows:
                await self._publish(rows)

    async def _publish(self, rows: list[ClaimedRow]) -> None:
        started = time.monotonic()
        with contextlib.ExitStack() as spans:
            try:
                async with asyncio.timeout(self._settings.publish_timeout):
                    shards = await self._shards.current()
            except (TimeoutError, RedisError, OSError, InvalidShardCount) as exc:
                self._failed(rows, [PublishResult(stream=r.stream, error=exc) for r in rows])
                return
            entries, encoded = encode_rows(rows, shards, spans)
            sent = iter(
                await publish_entries(
                    self._publisher, entries, settings=self._settings, metrics=self._metrics
                )
            )
            results = [r if r is not None else next(sent) for r in encoded]
        ok = [row.id for row, result in zip(rows, results, strict=True) if result.ok]
        self._memory.published(sum(len(r.payload or "") for r in rows), len(ok))
        if len(ok) < len(rows):
            self._failed(rows, results)
        if ok:
            self._metrics.notified_rows.inc(len(ok))
            out = set(ok)
            streams = (r.stream for r in rows if r.id in out)
            for queue, n in collections.Counter(map(queue_label, streams)).items():
                self._metrics.processed.labels(queue).inc(n)
            self._to_delete.update(ok)
            self._start("delete", self._delete_published)
        await self._published(len(rows), started)

    def _failed(self, rows: Sequence[ClaimedRow], results: Sequence[PublishResult]) -> None:
        """Leave unpublished rows as they are and hand them to the claim path."""
        failed = [(row, res) for row, res in zip(rows, results, strict=True) if not res.ok]
        self._inflight.release(row.id for row, _ in failed)
        self.failed_batches += 1
        errors = [res.error for _, res in failed]
        log.warning(
            "could not publish %d notified rows (%s); they stay in the outbox, uncharged",
            len(failed),
            errors[0],
        )
        if any(is_out_of_memory(e) for e in errors):
            self._memory.refused()  # the memory gate resumes the claim path when there is room
        else:
            # Redis unreachable included: the claim path retries the rows with backoff and
            # charges each failed attempt, as it does for every row it cannot publish.
            self._wake()

    async def _delete_published(self) -> None:
        delay = _DELETE_RETRY
        while self._to_delete:
            ids = list(self._to_delete)
            try:
                await self._repo.delete_notified(ids)
            except Exception as exc:
                # Still registered: no claim of ours publishes them again meanwhile.
                log.warning("could not delete %d published rows (%s); retrying", len(ids), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _DELETE_RETRY_MAX)
                continue
            delay = _DELETE_RETRY
            self._to_delete.difference_update(ids)
            self._inflight.release(ids)
