"""``Worker``: consume a queue's shard streams, run the handler, settle each entry.

One worker process reads every shard stream of its queues, each with its own
read and reclaim loops (``reader.py``), and runs handlers in one bounded pool
of slots: each read batch is one task that claims all its entries at once and
then runs them concurrently (``delivery.py``); finished entries are acked in
groups (``settle.py``) and long runs keep their leases (``leases.py``). It
re-reads ``composer:stream_shards`` every few seconds and starts loops for new
shards without a restart. It does not trust the count for reading: it never
stops reading a shard it read, and it looks for other shard streams of its
queues that still hold entries or pending entries (a decrease made before it
started, a writer that still had the old count) and reads those too
(``stream/discovery.py``). ``request_stop()`` stops reading; handlers in hand finish
within the grace period, the rest stay pending for another worker; a consumer
with nothing pending is then removed from its group. Until ``run()`` returns,
every handler still running keeps its lease and its entry fresh; a sync
handler's thread cannot be stopped, so ``abandoned`` counts the threads still
running when ``run()`` returns, and the process should then end at once (the
CLI exits hard) before their leases can lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.discovery import existing_shards
from dispatcher.stream.entries import Message
from dispatcher.stream.naming import parse_task_stream, queue_streams, task_stream
from dispatcher.stream.shard_count import read_shard_count
from dispatcher.stream.stats import stream_stats
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.config import WorkerConfig
from dispatcher.worker.dedup import AttemptGuard
from dispatcher.worker.delivery import Deliveries
from dispatcher.worker.handler import Handler
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.metrics import WorkerMetrics
from dispatcher.worker.reader import StreamReader
from dispatcher.worker.settle import Settler
from dispatcher.worker.slots import SlotPool

__all__ = ["Worker"]

log = logging.getLogger(__name__)

# Without an answer from Redis for this long a worker leaves rotation (readiness), ...
REDIS_UNREADY_AFTER = 15.0
# ... and only after this long is it presumed stuck (liveness): a Redis failover can take
# minutes, and restarting every worker for it only adds a storm of reconnects.
REDIS_DEAD_AFTER = 600.0
# Look for left-over shard streams (a keyspace SCAN) every this many shard-count polls, and
# whenever the count drops.
DISCOVER_EVERY_POLLS = 6


class Worker:
    """Runs ``handler`` for every entry of ``config.queues`` until asked to stop."""

    def __init__(
        self,
        client: RedisClient,
        handler: Handler,
        config: WorkerConfig,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._clock = clock
        self.config = config
        self.metrics = WorkerMetrics(registry if registry is not None else CollectorRegistry())
        self.shards = 0
        self._handler = handler
        self._stopping = asyncio.Event()
        self._readers: dict[str, StreamReader] = {}
        self._loops: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._in_flight: set[tuple[str, str]] = set()
        self._slots = SlotPool(config.concurrency)
        self._last_redis_ok = 0.0
        self._started = False
        self._executor = ThreadPoolExecutor(config.concurrency, thread_name_prefix="handler")
        self._deliveries = self._make_deliveries()

    # -- public surface -------------------------------------------------------

    @property
    def streams(self) -> list[str]:
        return list(self._readers)

    @property
    def abandoned(self) -> int:
        """Sync handler threads still running (after ``run()``: left behind by the grace period)."""
        return len(self._deliveries.threads)

    def request_stop(self) -> None:
        """Stop reading; ``run()`` returns once handlers in hand are settled."""
        self._stopping.set()

    def live(self) -> bool:
        """Started, no loop died, and Redis answered within ``REDIS_DEAD_AFTER`` (always true
        while stopping)."""
        if not self._started or self._stopping.is_set():
            return self._started
        return not self._crashed() and self._redis_silent_for() < REDIS_DEAD_AFTER

    def ready(self) -> bool:
        """Live, not stopping, and Redis answered within ``REDIS_UNREADY_AFTER``."""
        return (
            self._started
            and not self._stopping.is_set()
            and not self._crashed()
            and self._redis_silent_for() < REDIS_UNREADY_AFTER
        )

    def _crashed(self) -> bool:
        return any(t.done() for t in self._loops) or bool(self._keeper and self._keeper.done())

    def _redis_silent_for(self) -> float:
        return self._clock() - self._last_redis_ok

    async def run(self) -> None:
        """Read and handle until ``request_stop()``; then drain and leave the groups."""
        try:
            await self._start()
            await self._stopping.wait()
            log.info("stopping: no new reads; waiting for handlers in hand")
            await self._drain()
            await self._leave_groups()
        finally:
            keeper = {self._keeper} if self._keeper else set()
            await self._cancel(self._loops | self._handlers | keeper)
            await self._deliveries.claims.aclose()
            await self._deliveries.settler.aclose()
            # A sync handler still running past the grace period cannot be
            # interrupted: we stop waiting for it, its entry stays pending, and
            # the caller ends the process (``abandoned``).
            self._executor.shutdown(wait=False, cancel_futures=True)
            log.info("worker stopped", extra={"consumer": self.config.consumer})

    # -- start-up and shard growth -------------------------------------------

    def _make_deliveries(self) -> Deliveries:
        guard = AttemptGuard(
            self.client,
            owner=self.config.consumer,
            lease_ttl_ms=int(self.config.lease_ttl * 1000),
            done_ttl_ms=int(self.config.dedup_window * 1000),
        )
        return Deliveries(
            client=self.client,
            handler=self._handler,
            guard=guard,
            claims=Coalescer(guard.claim_many, name="claim"),
            leases=LeaseKeeper(guard, reclaim_idle=self.config.reclaim_idle),
            settler=Settler(self.client, guard),
            metrics=self.metrics,
            max_runs=self.config.max_runs,
            handler_timeout=self.config.handler_timeout,
            executor=self._executor,
        )

    async def _start(self) -> None:
        shards = await read_shard_count(self.client, fallback=self.config.shards)
        await self._grow_to(shards)
        await self._discover()
        self._last_redis_ok = self._clock()
        # Not a loop of its own: it renews leases of handlers still draining.
        self._keeper = asyncio.create_task(self._deliveries.leases.run(), name="lease keeper")
        self._keeper.add_done_callback(_log_crash)
        self._spawn_loop(self._watch_shards(), "shard watch")
        self._spawn_loop(self._report_stats(), "stream stats")
        self._started = True
        log.info(
            "worker started",
            extra={
                "queues": ",".join(self.config.queues),
                "shards": shards,
                "group": self.config.group,
                "consumer": self.config.consumer,
                "concurrency": self.config.concurrency,
            },
        )

    async def _grow_to(self, shards: int) -> None:
        """Start reading the streams of ``shards`` shards that are not read yet."""
        for stream in queue_streams(self.config.queues, shards):
            if stream not in self._readers:
                await self._add_stream(stream)
        self.shards = shards
        self.metrics.streams.set(len(self._readers))

    async def _discover(self) -> None:
        """Start reading other shard streams of our queues that still hold work."""
        try:
            await self._discover_each()
        except (RedisError, OSError) as exc:  # e.g. an ACL without SCAN: the count still works
            log.warning("cannot look for left-over shard streams: %s", exc)

    async def _discover_each(self) -> None:
        for queue in self.config.queues:
            for shard in sorted(await existing_shards(self.client, queue)):
                stream = task_stream(queue, shard)
                if stream in self._readers:
                    continue
                stats = await stream_stats(self.client, stream, self.config.group)
                if stats.length or stats.pending:
                    log.info("reading a shard beyond the count until it is empty: %s", stream)
                    await self._add_stream(stream)
        self.metrics.streams.set(len(self._readers))

    async def _add_stream(self, stream: str) -> None:
        consumer = RedisStreamConsumer(
            client=self.client,
            stream=stream,
            group=self.config.group,
            consumer=self.config.consumer,
            block_ms=self.config.block_ms,
            reclaim_limit=self.config.concurrency,
            reclaim_batch=self.config.concurrency,
        )
        await consumer.setup()
        reader = StreamReader(
            consumer=consumer,
            queue=_queue_of(stream),
            slots=self._slots,
            submit=self._submit,
            stopping=self._stopping,
            reclaim_idle_ms=self.config.reclaim_idle_ms,
            on_redis_ok=self._redis_ok,
        )
        self._readers[stream] = reader
        self._spawn_loop(reader.read_loop(), f"read {stream}")
        self._spawn_loop(reader.reclaim_loop(), f"reclaim {stream}")

    async def _watch_shards(self) -> None:
        polls = 0
        while not await self._stopped_within(self.config.shard_poll_interval):
            polls += 1
            try:
                shards = await read_shard_count(self.client, fallback=self.shards)
                if shards != self.shards:
                    log.info("shard count changed from %d to %d", self.shards, shards)
                dropped = shards < self.shards
                await self._grow_to(shards)
                if dropped or polls % DISCOVER_EVERY_POLLS == 0:
                    await self._discover()
            except (RedisError, OSError, ValueError) as exc:
                log.warning("cannot refresh the shard count: %s", exc)

    async def _report_stats(self) -> None:
        while not await self._stopped_within(self.config.stats_interval):
            for stream, reader in list(self._readers.items()):
                try:
                    stats = await stream_stats(self.client, stream, self.config.group)
                except (RedisError, OSError) as exc:
                    log.warning("cannot read stream stats: %s", exc, extra={"stream": stream})
                    break
                self.metrics.observe_stream(reader.queue, stats)
                self._redis_ok()

    # -- handling ---------------------------------------------------------------

    async def _submit(self, reader: StreamReader, batch: Sequence[Message], held: int) -> None:
        """Start the batch in as few pieces as free slots allow; wait holding none.

        ``held`` slots were taken for the batch's first entries by the caller.
        """
        todo = [m for m in batch if (m.stream, m.id) not in self._in_flight]
        if held:
            part, todo = todo[:held], todo[held:]
            self._slots.release(held - len(part))  # taken for entries already in hand
            if part:
                self._start_batch(reader, part)
        while todo:
            taken = self._slots.take(len(todo))
            if not taken:
                await self._slots.acquire()
                taken = 1 + self._slots.take(len(todo) - 1)
            part, todo = todo[:taken], todo[taken:]
            self._start_batch(reader, part)

    def _start_batch(self, reader: StreamReader, messages: list[Message]) -> None:
        self._in_flight.update((m.stream, m.id) for m in messages)
        task = asyncio.create_task(self._process(reader, messages), name=f"batch {messages[0].id}")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _process(self, reader: StreamReader, messages: list[Message]) -> None:
        """Run one batch; a slot frees when its handler is done, ``_in_flight`` at the end."""
        holding = {message.id for message in messages}

        def freed(message: Message) -> None:
            if message.id in holding:
                holding.discard(message.id)
                self._slots.release()

        try:
            await self._deliveries.process(reader.consumer, reader.queue, messages, freed=freed)
        except Exception:
            log.exception("unexpected error settling entries", extra={"stream": reader.stream})
        finally:
            for message in messages:
                freed(message)
                self._in_flight.discard((message.stream, message.id))

    # -- shutdown -----------------------------------------------------------------

    async def _drain(self) -> None:
        """Let loops exit and handlers finish, all within the grace period."""
        deadline = time.monotonic() + self.config.grace_period
        if self._loops:
            await asyncio.wait(self._loops, timeout=self.config.grace_period)
        await self._cancel(self._loops)
        while self._handlers and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(set(self._handlers), timeout=left)
        if self._handlers:
            log.warning(
                "grace period over: %d entries in hand cancelled; they stay pending",
                len(self._in_flight),
            )
            await self._cancel(self._handlers)
        if self.abandoned:
            log.warning(
                "%d sync handlers still running after the grace period: their leases are "
                "kept until the process exits",
                self.abandoned,
            )

    async def _leave_groups(self) -> None:
        """XGROUP DELCONSUMER on every stream where this consumer holds nothing."""
        for stream, reader in self._readers.items():
            try:
                if await reader.consumer.pending_count() == 0:
                    await self.client.xgroup_delconsumer(
                        stream, self.config.group, self.config.consumer
                    )
                else:
                    log.info(
                        "consumer keeps pending entries; not removed", extra={"stream": stream}
                    )
            except (RedisError, OSError) as exc:
                log.warning("cannot remove the consumer: %s", exc, extra={"stream": stream})

    # -- plumbing -------------------------------------------------------------------

    def _spawn_loop(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._loops.add(task)
        task.add_done_callback(_log_crash)

    def _redis_ok(self) -> None:
        self._last_redis_ok = self._clock()

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._stopping.is_set()

    @staticmethod
    async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _queue_of(stream: str) -> str:
    queue, _shard = parse_task_stream(stream)
    return queue


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("worker loop %s crashed: %s", task.get_name(), exc, exc_info=exc)
