"""The shard streams one worker reads: those of the shard count, and left-over ones.

The worker reads every stream of its queues for the current
``composer:stream_shards`` and starts loops for new shards without a restart
(``watch``). It does not trust the count for reading: it never stops reading
a shard it read, and it looks for other shard streams of its queues that
still hold entries or pending entries (a decrease made before it started, a
writer that still had the old count) and reads those too
(``stream/discovery.py``), at start, whenever the count drops, and every few
polls. On the way out it leaves the groups of the streams where it holds
nothing (``leave_groups``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.discovery import existing_shards
from dispatcher.stream.naming import DEFAULT_SHARDS, parse_task_stream, queue_streams, task_stream
from dispatcher.stream.shard_count import InvalidShardCount, read_shard_count
from dispatcher.stream.stats import stream_stats
from dispatcher.worker.reader import BatchSink, ReadLimits, StreamReader
from dispatcher.worker.slots import SlotPool
from dispatcher.worker.task_set import LoopSet, RedisContact
from dispatcher.worker.worker_config import WorkerConfig
from dispatcher.worker.worker_metrics import WorkerMetrics

__all__ = ["WorkerStreams"]

log = logging.getLogger(__name__)

# Look for left-over shard streams (a keyspace SCAN) every this many shard-count polls, and
# whenever the count drops.
DISCOVER_EVERY_POLLS = 6


@dataclass(kw_only=True)
class WorkerStreams:
    """The ``StreamReader`` of every stream one worker reads; their loops run in ``loops``."""

    client: RedisClient
    config: WorkerConfig
    metrics: WorkerMetrics
    slots: SlotPool
    deliveries: BatchSink
    stopping: asyncio.Event
    contact: RedisContact
    loops: LoopSet
    limits: ReadLimits
    readers: dict[str, StreamReader] = field(default_factory=dict)
    shards: int = 0
    invalid_count: str | None = None  # the bad shard count said last
    count_read: bool = False  # an unset count is said (as a WARNING) on the first read only

    async def start(self) -> int:
        """Read the streams of the current count and the left-over ones; the count."""
        shards = await self._read_count(in_force=False)
        await self.grow_to(shards)
        await self.discover()
        return shards

    async def watch(self) -> None:
        """Follow the shard count until stopping."""
        polls = 0
        while not await self._stopped_within(self.config.shard_poll_interval):
            polls += 1
            try:
                shards = await self._read_count(in_force=True)
                if shards != self.shards:
                    log.info("shard count changed from %d to %d", self.shards, shards)
                dropped = shards < self.shards
                await self.grow_to(shards)
                if dropped or polls % DISCOVER_EVERY_POLLS == 0:
                    await self.discover()
            except (RedisError, OSError, ValueError) as exc:
                if not self.contact.outage.failed(exc, what="refreshing the shard count"):
                    log.warning("cannot refresh the shard count: %s", exc)

    async def _read_count(self, *, in_force: bool) -> int:
        """The published count; while it is invalid, the count in force (at start, the
        configured one), said once per bad value: the left-over streams are read anyway."""
        fallback = self.shards if in_force else self.config.shards
        try:
            shards = await read_shard_count(
                self.client, fallback=fallback, fallback_in_force=in_force, warn=not self.count_read
            )
            self.count_read = True
        except InvalidShardCount as exc:
            shards = fallback or DEFAULT_SHARDS
            if str(exc) != self.invalid_count:
                self.invalid_count = str(exc)
                log.warning("%s; reading %d shards and any other that holds work", exc, shards)
            return shards
        self.invalid_count = None
        return shards

    async def grow_to(self, shards: int) -> None:
        """Start reading the streams of ``shards`` shards that are not read yet."""
        for stream in queue_streams(self.config.queues, shards):
            if stream not in self.readers:
                await self._add(stream)
        self.shards = shards
        self.metrics.streams.set(len(self.readers))

    async def discover(self) -> None:
        """Start reading other shard streams of our queues that still hold work."""
        try:
            await self._discover_each()
        except (RedisError, OSError) as exc:  # e.g. an ACL without SCAN: the count still works
            log.warning("cannot look for left-over shard streams: %s", exc)

    async def leave_groups(self) -> None:
        """XGROUP DELCONSUMER on every stream where this consumer holds nothing."""
        for stream, reader in self.readers.items():
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

    def in_hand(self) -> int:
        """Entries read and not yet done with, over all streams."""
        return sum(len(reader.in_hand) for reader in self.readers.values())

    async def _discover_each(self) -> None:
        for queue in self.config.queues:
            for shard in sorted(await existing_shards(self.client, queue)):
                stream = task_stream(queue, shard)
                if stream in self.readers:
                    continue
                stats = await stream_stats(self.client, stream, self.config.group)
                if stats.length or stats.pending:
                    log.info("reading a shard beyond the count until it is empty: %s", stream)
                    await self._add(stream)
        self.metrics.streams.set(len(self.readers))

    async def _add(self, stream: str) -> None:
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
        queue, _shard = parse_task_stream(stream)
        reader = StreamReader(
            consumer=consumer,
            queue=queue,
            slots=self.slots,
            deliveries=self.deliveries,
            stopping=self.stopping,
            reclaim_idle_ms=self.config.reclaim_idle_ms,
            contact=self.contact,
            limits=self.limits,
        )
        self.readers[stream] = reader
        self.loops.start(reader.read_loop(), f"read {stream}")
        self.loops.start(reader.reclaim_loop(), f"reclaim {stream}")

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()
