"""The outbox enqueuer: the scheduling loop that runs batches, probes and maintenance.

It runs claim batches in ``BatchSlots`` (bounded concurrency). While batches come back full (a
backlog) it keeps every slot busy, and a slot claims its next batch in the settlement of the
one before (one round trip for both); otherwise it claims again when the idle flag says so
(``IdleFlag.after_claim``: linger between partial batches, short claims while nobody hears
NOTIFY), on a wake-up from the LISTEN connection, or after the poll interval (retries coming
due, lost notifications). Every wake-up is a ring of its ``LoopSignals``, which its parts are
given when built: none of them calls back into the loop.

A notification is a hint, never data: an empty one is a hint, anything else on the channel is
counted and ignored (``NotificationHints``), so only rows read from the table are published. A
hint that finds the enqueuer idle starts its batch at once in a free slot, without the loop's
turn (the idle dispatch's latency); one that finds a batch running rings the loop, so a flood
of hints costs no more claims than one.

Above a high mark of Redis memory (``RedisMemoryGate``) it claims nothing and rows wait in the
outbox, uncharged, until workers have made room; so too while Redis runs without AOF under
``--require-aof`` (``AofWatch``).

Committed cancels of runs go to Redis for the workers in a loop of their own (``CancelRelay``).
A maintenance loop (``Maintenance``) reads the journal of batches that never settled and plans
the probes of their rows (``SuspectProbes``), which this loop runs with every slot held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry

from dispatcher.outage import Outage
from dispatcher.outbox.backpressure import MemoryMarks, RedisMemoryGate
from dispatcher.outbox.batch_slots import BatchSlots
from dispatcher.outbox.cancel_relay import CancelRelay
from dispatcher.outbox.durability import AofWatch
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.listener import NotificationHints, OutboxListener
from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.maintenance import Maintenance
from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.pipeline import BatchPipeline
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.outbox.suspect_probes import SuspectProbes
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import LiveShardCount

__all__ = ["EnqueuerConfig", "OutboxEnqueuer"]

log = logging.getLogger(__name__)

DEFAULT_CONFIG = EnqueuerConfig()


class OutboxEnqueuer:
    """Drains the outbox into Redis Streams until ``request_stop()``.

    ``listen_conninfo`` enables the LISTEN wake-up; without it the enqueuer
    only polls. Rows are routed by the shard count read live from the publisher's
    Redis (``shard_fallback``, STREAM_SHARDS, while it is unset). Metrics go to
    ``registry`` (the CLI passes the process-wide one it serves; by default a
    registry of this enqueuer's own).

    It builds its parts once, each given what it needs, lowest first: the signals the loop
    waits on, the gates, the pipeline, the probes, the idle flag, the batch slots, then what
    rings or feeds them (maintenance, the hints, the listener, the cancel relay).
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        config: EnqueuerConfig = DEFAULT_CONFIG,
        listen_conninfo: str | None = None,
        shard_fallback: int | None = None,
        registry: CollectorRegistry | None = None,
        require_aof: bool = False,
    ) -> None:
        self.config = config
        self._repo = repository
        self.signals = LoopSignals()
        self.memory = RedisMemoryGate(
            publisher.client, marks=MemoryMarks(config.redis_memory_high, config.redis_memory_low)
        )
        self.durability = AofWatch(publisher.client, require=require_aof)
        self.metrics = EnqueuerMetrics(registry if registry is not None else CollectorRegistry())
        self.metrics.backpressure.set_function(lambda: 1 if self.memory.paused else 0)
        self.metrics.listener_connected.set_function(lambda: 1 if self.signals.listening else 0)
        # Redis as this enqueuer's loops see it: one warning per outage, whichever sees it.
        self.redis = Outage("Redis")
        self.pipeline = BatchPipeline(
            repository=repository,
            publisher=publisher,
            settings=config.batch_settings(),
            shard_count=LiveShardCount(
                publisher.client, fallback=shard_fallback, outage=self.redis
            ),
            memory=self.memory,
            metrics=self.metrics,
            outage=self.redis,
        )
        self.probes = SuspectProbes(
            repository=repository,
            pipeline=self.pipeline,
            signals=self.signals,
            retry_after=config.poll_interval,
        )
        conninfo, kwargs = repository.session_settings()
        self.idle_flag = IdleFlag(
            conninfo=conninfo,
            connect_kwargs=kwargs,
            metrics=self.metrics,
            policy=config.idle_policy(),
        )
        self.slots = BatchSlots(
            concurrency=config.concurrency,
            pipeline=self.pipeline,
            probes=self.probes,
            memory=self.memory,
            durability=self.durability,
            idle_flag=self.idle_flag,
            signals=self.signals,
        )
        self.maintenance = Maintenance(
            repository=repository,
            metrics=self.metrics,
            flag=self.idle_flag,
            probes=self.probes,
            vacuum_threshold=config.vacuum_threshold,
            every=config.maintenance_interval,
            signals=self.signals,
        )
        self._heartbeat = time.monotonic()
        self.cancels = CancelRelay(
            pool=repository.pool,
            client=publisher.client,
            config=config,
            registry=self.metrics.registry,
            outage=self.redis,
            listen_conninfo=listen_conninfo,
        )
        self.hints = NotificationHints(target=self.slots, metrics=self.metrics)
        self.listener = (
            OutboxListener(
                conninfo=listen_conninfo,
                hints=self.hints,
                signals=self.signals,
                rotate_after=config.listener_rotate_after,
            )
            if listen_conninfo
            else None
        )

    def live(self) -> bool:
        """The scheduling loop has turned, or a slot claimed, recently (a wedged loop fails
        /healthz)."""
        turned = max(self._heartbeat, self.slots.heartbeat)
        return time.monotonic() - turned < max(60.0, 10 * self.config.poll_interval)

    def ready(self) -> bool:
        """Commits reach us within milliseconds: the LISTEN connection is up (if any)."""
        return self.listener is None or self.listener.connected

    @property
    def idle_flag_held(self) -> bool:
        """True while this enqueuer holds the idle flag: outbox inserts NOTIFY."""
        return self.idle_flag.held

    def request_stop(self) -> None:
        """Stop claiming; in-flight batches finish (bounded by ``shutdown_timeout``)."""
        self.signals.request_stop()

    async def process_batch(self) -> int:
        """One batch, start to end, outside the loop; how many rows it held."""
        return await self.pipeline.run()

    async def run(self) -> None:
        log.info(
            "outbox enqueuer starting",
            extra={"batch_size": self.config.batch_size, "concurrency": self.config.concurrency},
        )
        first_pass = asyncio.Event()
        helpers = [
            asyncio.create_task(self.maintenance.loop(first_pass), name="outbox-maintenance"),
            asyncio.create_task(self.cancels.run(), name="outbox-cancels"),
        ]
        if self.listener:
            helpers.append(asyncio.create_task(self.listener.run(), name="outbox-listener"))
        try:
            await first_pass.wait()  # settle the journal a crash left before claiming
            with contextlib.suppress(Exception):  # if it fails, the first claims find out
                await self.idle_flag.look()
            await self._main_loop()
        finally:
            await self.slots.drain(self.config.shutdown_timeout)
            await self._withdraw_quietly()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.idle_flag.aclose()
            await self._repo.aclose()
            log.info("outbox enqueuer stopped")

    async def _main_loop(self) -> None:
        signals, slots = self.signals, self.slots
        slots.open()  # hints may start batches from now on
        while not signals.stopping:
            self._heartbeat = time.monotonic()
            if self.idle_flag_held and not signals.can_listen():
                await self._withdraw_quietly()  # nobody hears NOTIFY now: the poll takes over
            if not await self.memory.allows() or not await self.durability.allows():
                await self._hold_off()
                continue
            if self.probes.due():
                async with slots.all_held():
                    await self.probes.run_turn()
                continue
            if not await slots.start():
                break
            if slots.backlog:
                continue  # the last batch was full: fill every free slot at once
            await signals.wait(self.config.poll_interval)

    async def _hold_off(self) -> None:
        """Redis is nearly full, or runs without AOF under --require-aof: claim nothing (rows
        stay PENDING) until that changes."""
        if self.idle_flag_held:
            await self._withdraw_quietly()  # no NOTIFY cost on the application's commits
        await self.signals.wait(min(self.config.poll_interval, 1.0))

    async def _withdraw_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self.idle_flag.drop()

    async def maintenance_once(self) -> dict[str, Any]:
        """Settle the journal of batches that never did; plan probes; refresh the gauges."""
        return await self.maintenance.run_once()
