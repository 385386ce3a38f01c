"""The outbox enqueuer: the scheduler that runs batches, probes and maintenance.

It runs claim batches (``BatchPipeline``) with bounded concurrency. While
batches come back full (a backlog) it keeps every slot busy, and a slot
claims its next batch in the settlement of the one before (one round trip
for both, up to ``_CHAIN_MAX`` in a row); otherwise it
claims again when the idle flag says so (``IdleFlag.after_claim``: linger
between partial batches, short claims while nobody hears NOTIFY), on a
wake-up from the LISTEN connection, or after the poll interval (retries coming
due, lost notifications). A notification is a hint, never data: an empty one
wakes a claim, anything else on the channel is counted and ignored
(``NotificationHints``), so only rows read from the table are published. A
hint that finds the enqueuer idle starts its batch itself, without the loop's
turn (the idle dispatch's latency); one that finds a batch running wakes the
loop, so a flood of hints costs no more claims than one.

Above a high mark of Redis memory (``RedisMemoryGate``) it claims nothing and
rows wait in the outbox, uncharged, until workers have made room; so too while
Redis runs without AOF under ``--require-aof`` (``AofWatch``).

Committed cancels of runs go to Redis for the workers in a loop of their own
(``CancelRelay``). A maintenance loop (``Maintenance``) reads the journal of batches that never
settled and plans the probes of their rows (``SuspectProbes``), which this
scheduler runs with every slot held.
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
from dispatcher.outbox.cancel_relay import CancelRelay
from dispatcher.outbox.durability import AofWatch
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.listener import NotificationHints, OutboxListener
from dispatcher.outbox.maintenance import Maintenance
from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.pipeline import BatchPipeline
from dispatcher.outbox.repository import OutboxRepository
from dispatcher.outbox.suspect_probes import SuspectProbes
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import LiveShardCount

__all__ = ["EnqueuerConfig", "OutboxEnqueuer"]

log = logging.getLogger(__name__)

# Full batches a slot claims in its previous batch's settlement before it hands the slot back
# to the scheduling loop (which checks for due suspects, the memory gate and stopping between
# batches too). One claim round trip less per batch while draining.
_CHAIN_MAX = 32

DEFAULT_CONFIG = EnqueuerConfig()


class OutboxEnqueuer:
    """Drains the outbox into Redis Streams until ``request_stop()``.

    ``listen_conninfo`` enables the LISTEN wake-up; without it the enqueuer
    only polls. Rows are routed by the shard count read live from the publisher's
    Redis (``shard_fallback``, STREAM_SHARDS, while it is unset). Metrics go to
    ``registry`` (the CLI passes the process-wide one it serves; by default a
    registry of this enqueuer's own).
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
        self.memory = RedisMemoryGate(
            publisher.client, marks=MemoryMarks(config.redis_memory_high, config.redis_memory_low)
        )
        self.durability = AofWatch(publisher.client, require=require_aof)
        self.metrics = EnqueuerMetrics(registry if registry is not None else CollectorRegistry())
        self.metrics.backpressure.set_function(lambda: 1 if self.memory.paused else 0)
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
            wake=self.wake,
            retry_after=config.poll_interval,
        )
        conninfo, kwargs = repository.session_settings()
        self.idle_flag = IdleFlag(
            conninfo=conninfo,
            connect_kwargs=kwargs,
            metrics=self.metrics,
            policy=config.idle_policy(),
        )
        self.maintenance = Maintenance(
            repository=repository,
            metrics=self.metrics,
            flag=self.idle_flag,
            probes=self.probes,
            vacuum_threshold=config.vacuum_threshold,
            every=config.maintenance_interval,
            wake=self.wake,
            can_listen=self._can_listen,
        )
        self._kick = asyncio.Event()
        self._stopping = False
        self._backlog = False
        self._heartbeat = time.monotonic()
        self.cancels = CancelRelay(
            pool=repository.pool,
            client=publisher.client,
            config=config,
            registry=self.metrics.registry,
            outage=self.redis,
            listen_conninfo=listen_conninfo,
        )
        # The main loop's slots and running batches, while it runs (hints start batches too).
        self._slots: asyncio.Semaphore | None = None
        self._batches: set[asyncio.Task[int]] | None = None
        self.hints = NotificationHints(wake=self._on_hint, metrics=self.metrics)
        self.listener = (
            OutboxListener(
                conninfo=listen_conninfo,
                notified=self.hints.receive,
                wake=self.wake,
                rotate_after=config.listener_rotate_after,
                on_state=self._listener_state,
            )
            if listen_conninfo
            else None
        )

    def live(self) -> bool:
        """The scheduling loop has turned recently (a wedged loop fails /healthz)."""
        return time.monotonic() - self._heartbeat < max(60.0, 10 * self.config.poll_interval)

    def ready(self) -> bool:
        """Commits reach us within milliseconds: the LISTEN connection is up (if any)."""
        return self.listener is None or self.listener.connected

    @property
    def idle_flag_held(self) -> bool:
        """True while this enqueuer holds the idle flag: outbox inserts NOTIFY."""
        return self.idle_flag.held

    def wake(self) -> None:
        """Ask the loop to claim now; any number of calls collapse into one wake-up."""
        self._kick.set()

    def _on_hint(self) -> None:
        if self.idle_flag.elsewhere:  # standing by, the flag holder claims what commits
            return
        if not self._claim_at_once():
            self.wake()

    def _claim_at_once(self) -> bool:
        """Start a batch from the hint if the loop would start just that one (nothing
        running, no backlog, nothing due, Redis with room at the last reading)."""
        slots, batches = self._slots, self._batches
        if (
            slots is None
            or batches is None
            or batches
            or self._stopping
            or self._backlog
            or self.probes.due()
            or not self.memory.open_now()
            or not self.durability.open_now()
        ):
            return False
        task = asyncio.get_running_loop().create_task(self._batch_in_slot(slots, acquire=True))
        batches.add(task)
        task.add_done_callback(batches.discard)
        return True

    def request_stop(self) -> None:
        """Stop claiming; in-flight batches finish (bounded by ``shutdown_timeout``)."""
        self._stopping = True
        self._kick.set()

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
        batches: set[asyncio.Task[int]] = set()
        try:
            await first_pass.wait()  # settle the journal a crash left before claiming
            with contextlib.suppress(Exception):  # if it fails, the first claims find out
                await self.idle_flag.look()
            await self._main_loop(batches)
        finally:
            await self._drain(batches)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.idle_flag.aclose()
            await self._repo.aclose()
            log.info("outbox enqueuer stopped")

    async def _main_loop(self, batches: set[asyncio.Task[int]]) -> None:
        slots = self._slots = asyncio.Semaphore(self.config.concurrency)
        self._batches = batches
        while not self._stopping:
            self._heartbeat = time.monotonic()
            if not await self.memory.allows() or not await self.durability.allows():
                await self._hold_off()
                continue
            if self.probes.due():
                await self.probes.run_alone(
                    slots, concurrency=self.config.concurrency, stopping=lambda: self._stopping
                )
                continue
            await slots.acquire()
            if self._stopping:
                slots.release()
                break
            task = asyncio.create_task(self._batch_in_slot(slots))
            batches.add(task)
            task.add_done_callback(batches.discard)
            if self._backlog:
                continue  # the last batch was full: fill every free slot at once
            await self._kicked(self.config.poll_interval)

    async def _hold_off(self) -> None:
        """Redis is nearly full, or runs without AOF under --require-aof: claim nothing (rows
        stay PENDING) until that changes."""
        if self.idle_flag_held:
            await self._withdraw_quietly()  # no NOTIFY cost on the application's commits
        await self._kicked(min(self.config.poll_interval, 1.0))

    async def _kicked(self, within: float) -> None:
        """Until a wake-up, or ``within`` seconds. A timeout scope, not wait_for: no task of
        its own, so a notification reaches the claim a few turns of the loop sooner."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._kick.wait()
        self._kick.clear()

    async def _batch_in_slot(self, slots: asyncio.Semaphore, *, acquire: bool = False) -> int:
        if acquire:  # started from a hint: its slot is free (it waits if the loop took it)
            await slots.acquire()
        started = time.monotonic()
        chained = 0

        async def more(count: int) -> bool:
            """A full batch published whole: claim the next in its settlement, unless held back.

            Saying yes reports this claim here (the pipeline reports the last one's size).
            """
            nonlocal started, chained
            if (
                self._stopping
                or chained >= _CHAIN_MAX
                or self.probes.due()
                or not await self.memory.allows()
                or not await self.durability.allows()
            ):
                return False  # the main loop decides what runs next
            chained += 1
            await self._after_claim(count, started)
            started = self._heartbeat = time.monotonic()
            return True

        try:
            count = await self.pipeline.run(more=more)
        except Exception:
            log.exception("outbox batch failed; its rows are retried or recovered")
            count = 0
        finally:
            slots.release()
        await self._after_claim(count, started)
        return count

    async def _after_claim(self, count: int, started: float) -> None:
        full = count >= self.config.batch_size
        self._backlog = full
        try:
            delay = await self.idle_flag.after_claim(
                count=count,
                started=started,
                ended=time.monotonic(),
                full=full,
                can_listen=self._can_listen(),
            )
        except Exception as exc:
            log.warning("could not update the idle flag: %s", exc)
            delay = None  # the poll claims next
        self._claim_in(delay)

    def _claim_in(self, delay: float | None) -> None:
        if delay is None:
            return
        if delay <= 0:
            self.wake()
        else:
            asyncio.get_running_loop().call_later(delay, self.wake)

    def _can_listen(self) -> bool:
        return bool(self.listener and self.listener.connected and not self._stopping)

    def _listener_state(self, connected: bool) -> None:
        self.metrics.listener_connected.set(1 if connected else 0)
        if not connected and self.idle_flag_held:
            # Nobody hears NOTIFY now; the poll takes over.
            asyncio.get_running_loop().create_task(self._withdraw_quietly())

    async def _withdraw_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self.idle_flag.drop()

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

    async def maintenance_once(self) -> dict[str, Any]:
        """Settle the journal of batches that never did; plan probes; refresh the gauges."""
        return await self.maintenance.run_once()
