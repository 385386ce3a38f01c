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

With ``publish_now`` (the command line's enqueuer on standalone Redis,
without WAIT replicas) the listener's connection lives in a thread of its
own, and that thread publishes a read's rows on a Redis connection of its
own before the event loop hears of them: a notification that wakes the
process goes out in straight-line code, without the event loop's wake-up,
task switches and awaits (commit to a reader's XREAD 0.21 against 0.31 ms
through the event loop; ``benchmarks/RESULTS.md``). The thread makes a
stream's consumer group and re-reads the shard count itself when they are
due. Everything after the XADD (metrics, the delete, a failure handed to
the claim path) runs on the event loop, as for the loop's own publishes.
Rows the thread does not take (the flag not held, Redis full, a group or
shard count it cannot make or read) go the event loop's way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
from redis.exceptions import RedisError, ResponseError

from dispatcher.outbox.backpressure import RedisMemoryGate
from dispatcher.outbox.encoding import encode_rows
from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.metrics import EnqueuerMetrics, queue_label
from dispatcher.outbox.outcomes import ClaimedRow, is_out_of_memory
from dispatcher.outbox.pipeline import BatchSettings, publish_entries
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.redis_connection import pack_commands
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.naming import SHARDS_KEY, Router
from dispatcher.stream.publisher import RedisStreamPublisher, error_code, xadd_command
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
        thread_redis_url: str | None = None,
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
        self.thread_rows = 0  # rows the listener's thread published (``publish_now``)
        self._reports: set[asyncio.Future[None]] = set()  # published() after a thread's publish
        self.failed_batches = 0
        # The listener thread's own connection (standalone Redis only): see publish_now.
        self._thread_redis = (
            _ThreadRedis(thread_redis_url, timeout=settings.publish_timeout)
            if thread_redis_url
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._router: Router | None = None  # the thread's

    @property
    def publishes_now(self) -> bool:
        """Whether ``publish_now`` may publish (else it hands every notification on)."""
        return self._thread_redis is not None and self._settings.wait_replicas == 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that ``publish_now``'s results go back to."""
        self._loop = loop

    def publish_now(self, payloads: list[str]) -> list[str]:
        """In the listener's thread: publish the rows of one read; return the rest.

        What it returns goes the event loop's way (``receive``, then
        ``publish_received``): wake-ups, unreadable notifications, and every
        row while the thread may not publish. Never raises.
        """
        loop, shards = self._loop, self._thread_shards()
        if loop is None or shards is None:
            return payloads
        rows: list[ClaimedRow] = []
        rest: list[str] = []
        of_row: dict[str, str] = {}  # each row's notification
        for payload in payloads:
            try:
                row = parse_notification(payload)
            except ValueError:
                row = None
            if row is None:
                rest.append(payload)
            else:
                rows.append(row)
                of_row[row.id] = payload
        try:
            mine = self._inflight.notify(rows)
        except Exception:
            log.exception("could not register notified rows; the event loop takes them")
            return payloads
        if not mine:
            return rest
        try:
            outcome = self._publish_in_thread(mine, shards)
        except Exception:  # a bug, not Redis: the rows go the event loop's way
            log.exception("publishing notified rows in the listener failed")
            outcome = None
        if outcome is None:
            self._inflight.release(row.id for row in mine)
            return rest + [of_row[row.id] for row in mine]
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
            loop.call_soon_threadsafe(self._landed, mine, *outcome)
        return rest

    def _thread_shards(self) -> int | None:
        """The shard count the thread may route by now, or None (the loop publishes)."""
        if not self.publishes_now or not self._flag.held or self._memory.paused:
            return None
        shards = self._shards.fresh()
        if shards is None and self._thread_redis is not None:
            try:  # due for a re-read: read it here rather than hand the row to the loop
                shards = self._shards.store(self._thread_redis.get(SHARDS_KEY))
            except (RedisError, OSError, InvalidShardCount):
                return None  # the loop's publish reads it again, and says what is wrong
        return shards

    def _publish_in_thread(
        self, rows: list[ClaimedRow], shards: int
    ) -> tuple[list[PublishResult], float, float] | None:
        """Encode and write the rows' XADDs; their results, or None to leave them to the loop."""
        assert self._thread_redis is not None
        started = time.monotonic()
        with contextlib.ExitStack() as spans:
            if self._router is None or self._router.shards != max(shards, 1):
                self._router = Router(shards)  # keeps its stream names from one read to the next
            entries, encoded = encode_rows(rows, shards, spans, route=self._router)
            for stream in {stream for stream, _ in entries}:
                if not self._group_made(stream):
                    return None  # the loop's publish makes it, or says why it cannot
            packed = b"".join([xadd_command(stream, fields) for stream, fields in entries])
            try:
                replies = self._thread_redis.send(packed, len(entries)) if entries else []
            except (RedisError, OSError) as exc:
                replies = [exc] * len(entries)
        sent = iter(replies)
        results = [
            r if r is not None else _result(stream, next(sent))
            for r, stream in zip(encoded, _streams(entries, encoded), strict=True)
        ]
        return results, started, time.monotonic()

    def _group_made(self, stream: str) -> bool:
        """Make the stream's group before its first entry (at 0, as the loop's publish does)."""
        group = self._publisher.group
        if group is None or self._publisher.group_ready(stream):
            return True
        assert self._thread_redis is not None
        create = ("XGROUP", "CREATE", stream, group, "0", "MKSTREAM")
        try:
            (reply,) = self._thread_redis.send(pack_commands([create]), 1)
        except (RedisError, OSError):
            return False
        if isinstance(reply, BaseException) and error_code(reply) != "BUSYGROUP":
            return False
        self._publisher.group_made(stream)
        return True

    def _landed(
        self, rows: list[ClaimedRow], results: list[PublishResult], started: float, ended: float
    ) -> None:
        """On the event loop: what follows a publish from the listener's thread."""
        self.thread_rows += sum(1 for result in results if result.ok)
        self._metrics.publish_latency.observe(ended - started)
        self._after_publish(rows, results)
        task = asyncio.ensure_future(self._published(len(rows), started))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

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
            if self._reports:
                await asyncio.wait(set(self._reports))
            task = self._tasks.get("delete")
            if task is not None:
                await asyncio.wait({task})
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            if self._thread_redis is not None:
                self._thread_redis.close()

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
        self._after_publish(rows, results)
        await self._published(len(rows), started)

    def _after_publish(self, rows: list[ClaimedRow], results: list[PublishResult]) -> None:
        """Count, delete what went out, hand what did not to the claim path."""
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


class _ThreadRedis:
    """One blocking connection to standalone Redis, used by the listener's thread alone."""

    def __init__(self, url: str, *, timeout: float) -> None:
        self._pool = redis.ConnectionPool.from_url(
            url, decode_responses=True, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._conn: Any = None

    def send(self, packed: bytes, replies: int) -> list[Any]:
        """Write ``packed`` (``replies`` commands); each reply, or the error it was."""
        if self._conn is None:
            self._conn = self._pool.get_connection()
        conn = self._conn
        try:
            conn.send_packed_command([packed], check_health=False)
            out: list[Any] = []
            for _ in range(replies):
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:  # that command's own error: the rest follow
                    out.append(exc)
            return out
        except BaseException:
            conn.disconnect()  # replies may still be on their way: never reused
            self._conn = None
            raise

    def get(self, key: str) -> Any:
        """``GET key`` on the same connection; raises its error."""
        (reply,) = self.send(pack_commands([("GET", key)]), 1)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        self._conn = None
        self._pool.disconnect()


def _streams(entries: list[tuple[str, Any]], encoded: list[PublishResult | None]) -> list[str]:
    """Per row, the stream its entry went to (a failed row: the stream it named)."""
    sent = iter(entries)
    return [next(sent)[0] if r is None else r.stream for r in encoded]


def _result(stream: str, reply: Any) -> PublishResult:
    if isinstance(reply, BaseException):
        return PublishResult(stream=stream, error=reply)
    return PublishResult(stream=stream, entry_id=str(reply))
