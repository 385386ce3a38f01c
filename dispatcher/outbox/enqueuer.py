"""The outbox enqueuer: the scheduler that runs batches, probes and maintenance.

It runs claim batches (``BatchPipeline``) with bounded concurrency. While
batches come back full (a backlog) it keeps every slot busy; otherwise it
claims again when the idle flag says so (``IdleFlag.after_claim``: linger
between partial batches, short claims while nobody hears NOTIFY), on a
wake-up from the LISTEN connection, or after the poll interval (retries coming
due, lost notifications).

Above a high mark of Redis memory (``RedisMemoryGate``) it claims nothing and
rows wait in the outbox, uncharged, until workers have made room.

A maintenance loop reads the journal of batches that never settled (an
enqueuer crashed, hung or lost PostgreSQL mid-batch). Such a batch is not a
verdict on all its rows: they come back as suspects, uncharged, and this
scheduler claims each alone (a probe) while no other batch of this process
runs, so a crash during a probe can only be that row's doing. A probe that
never settles counts an attempt for its row: the row that kills every
enqueuer that takes it reaches the DLQ after its retries, and its batch-mates
are published without an attempt charged to them. It also vacuums the outbox
when nothing else has (``OutboxVacuum``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from dispatcher.options import option
from dispatcher.outbox.backpressure import MemoryMarks, RedisMemoryGate
from dispatcher.outbox.idle_flag import IdleFlag, IdlePolicy
from dispatcher.outbox.listener import OutboxListener
from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.pipeline import BatchPipeline, BatchSettings
from dispatcher.outbox.repository import STATUSES, OutboxRepository
from dispatcher.outbox.vacuum import OutboxVacuum
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import LiveShardCount

__all__ = ["EnqueuerConfig", "OutboxEnqueuer"]

log = logging.getLogger(__name__)

# Suspects probed in one turn before other batches get the slots back.
PROBES_PER_TURN = 10


@dataclass(frozen=True, slots=True)
class EnqueuerConfig:
    batch_size: int = option(100, minimum=1, help="rows per claim (one transaction)")
    concurrency: int = option(4, minimum=1, help="batches in flight at once")
    poll_interval: float = option(
        1.0, minimum=0.01, help="seconds between polls when no NOTIFY wakes the enqueuer"
    )
    recover_in_flight_after: float = option(
        30.0,
        minimum=1,
        help="seconds a batch may hang before PostgreSQL ends its transaction and its rows "
        "are due again (must exceed --publish-timeout)",
    )
    maintenance_interval: float = option(
        30.0,
        minimum=0.1,
        help="seconds between runs that count the attempts of batches that never settled",
    )
    wait_replicas: int = option(
        0,
        minimum=0,
        help="Redis replicas that must acknowledge a batch (WAIT) before its rows are deleted",
    )
    wait_timeout_ms: int = 1000
    publish_timeout: float = option(10.0, minimum=0.1, help="seconds to publish one batch")
    shutdown_timeout: float = option(
        30.0, minimum=0, help="seconds to finish in-flight batches after SIGTERM"
    )
    listener_rotate_after: float = 600.0
    # The idle flag's policy (see IdlePolicy for each).
    busy_at_rows: int = 2
    idle_confirm_after: float = 0.005
    linger: float = 0.002
    blocked_claim_every: float = 0.005
    blocked_backoff_after: float = 2.0
    redis_memory_high: float = option(
        MemoryMarks().high,
        minimum=0,
        help="share of Redis maxmemory at which claims pause and rows wait in the outbox "
        "(no attempt counted); 0 = never pause",
    )
    redis_memory_low: float = option(
        MemoryMarks().low,
        minimum=0,
        help="share of Redis maxmemory below which paused claims resume",
    )
    vacuum_threshold: int = option(
        10_000,
        minimum=0,
        help="dead tuples in the outbox past which maintenance vacuums it when nothing else "
        "has for a minute (autovacuum off or starved); 0 = leave it to autovacuum",
    )

    def __post_init__(self) -> None:
        MemoryMarks(self.redis_memory_high, self.redis_memory_low)  # validates them
        if self.batch_size < 1 or self.concurrency < 1:
            raise ValueError("batch size and concurrency must be >= 1")
        if self.poll_interval <= 0 or self.maintenance_interval <= 0:
            raise ValueError("poll and maintenance intervals must be > 0")
        if self.recover_in_flight_after <= self.publish_timeout:  # it bounds WAIT too
            raise ValueError(
                "recover-in-flight-after must exceed the publish timeout "
                f"({self.publish_timeout:g} s), or PostgreSQL would end batches still publishing"
            )

    def batch_settings(self) -> BatchSettings:
        return BatchSettings(
            batch_size=self.batch_size,
            hold_for=self.recover_in_flight_after,
            publish_timeout=self.publish_timeout,
            wait_replicas=self.wait_replicas,
            wait_timeout_ms=self.wait_timeout_ms,
        )

    def idle_policy(self) -> IdlePolicy:
        return IdlePolicy(
            busy_at_rows=self.busy_at_rows,
            idle_confirm_after=self.idle_confirm_after,
            linger=self.linger,
            blocked_claim_every=self.blocked_claim_every,
            blocked_backoff_after=self.blocked_backoff_after,
            max_delay=self.poll_interval,
        )


class OutboxEnqueuer:
    """Drains the outbox into Redis Streams until ``request_stop()``.

    ``listen_conninfo`` enables the LISTEN wake-up; without it the enqueuer
    only polls. ``shard_count`` is the count rows are routed by when published
    (by default read live from the publisher's Redis). Metrics go to
    ``registry`` (the CLI passes the process-wide one it serves; by default a
    registry of this enqueuer's own).
    """

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        publisher: RedisStreamPublisher,
        config: EnqueuerConfig = EnqueuerConfig(),
        listen_conninfo: str | None = None,
        shard_count: LiveShardCount | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self._repo = repository
        self.metrics = EnqueuerMetrics(registry if registry is not None else CollectorRegistry())
        self.memory = RedisMemoryGate(
            publisher.client, marks=MemoryMarks(config.redis_memory_high, config.redis_memory_low)
        )
        self.metrics.backpressure.set_function(lambda: 1 if self.memory.paused else 0)
        self._vacuum = OutboxVacuum(repository.pool, threshold=config.vacuum_threshold)
        self.pipeline = BatchPipeline(
            repository=repository,
            publisher=publisher,
            settings=config.batch_settings(),
            shard_count=shard_count,
            memory=self.memory,
            metrics=self.metrics,
        )
        conninfo, kwargs = repository.session_settings()
        self.idle_flag = IdleFlag(
            conninfo=conninfo,
            connect_kwargs=kwargs,
            metrics=self.metrics,
            policy=config.idle_policy(),
        )
        self._kick = asyncio.Event()
        self._stopping = False
        self._backlog = False
        self._next_probe: float | None = None  # when suspects are due (monotonic), if any
        self._heartbeat = time.monotonic()
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

    def live(self) -> bool:
        """The scheduling loop has turned recently (a wedged loop fails /healthz)."""
        return time.monotonic() - self._heartbeat < max(60.0, 10 * self.config.poll_interval)

    def ready(self) -> bool:
        """Commits reach us within milliseconds: the LISTEN connection is up (if any)."""
        return self.listener is None or self.listener.connected

    @property
    def idle_announced(self) -> bool:
        """True while this enqueuer holds the idle flag: outbox inserts NOTIFY."""
        return self.idle_flag.held

    def wake(self) -> None:
        """Ask the loop to claim now; any number of calls collapse into one wake-up."""
        self._kick.set()

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
            asyncio.create_task(self._maintenance_loop(first_pass), name="outbox-maintenance")
        ]
        if self.listener:
            helpers.append(asyncio.create_task(self.listener.run(), name="outbox-listener"))
        batches: set[asyncio.Task[int]] = set()
        try:
            await first_pass.wait()  # settle the journal a crash left before claiming
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
        slots = asyncio.Semaphore(self.config.concurrency)
        while not self._stopping:
            self._heartbeat = time.monotonic()
            if not await self.memory.allows():
                await self._hold_off()
                continue
            if self._next_probe is not None and time.monotonic() >= self._next_probe:
                await self._probe_alone(slots)
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.config.poll_interval)
            self._kick.clear()

    async def _hold_off(self) -> None:
        """Redis is nearly full: claim nothing (rows stay PENDING) until it has room again."""
        if self.idle_announced:
            await self._withdraw_quietly()  # no NOTIFY cost on the application's commits
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), min(self.config.poll_interval, 1.0))
        self._kick.clear()

    async def _batch_in_slot(self, slots: asyncio.Semaphore) -> int:
        started = time.monotonic()
        try:
            count = await self.pipeline.run()
        except Exception:
            log.exception("outbox batch failed; its rows are retried or recovered")
            count = 0
        finally:
            slots.release()
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
        return count

    def _claim_in(self, delay: float | None) -> None:
        if delay is None:
            return
        if delay <= 0:
            self.wake()
        else:
            asyncio.get_running_loop().call_later(delay, self.wake)

    async def _probe_alone(self, slots: asyncio.Semaphore) -> None:
        """Claim due suspects one at a time, with every slot held: nothing else runs beside."""
        for _ in range(self.config.concurrency):
            await slots.acquire()
        failed = False
        try:
            for _ in range(PROBES_PER_TURN):
                if self._stopping or not await self.pipeline.run(probe=True):
                    break
        except Exception:
            log.exception("probing a suspect row failed; recovery counts its attempt")
            failed = True
        finally:
            for _ in range(self.config.concurrency):
                slots.release()
        await self._plan_probes(not_before=self.config.poll_interval if failed else 0.0)
        self.wake()

    async def _plan_probes(self, *, not_before: float = 0.0) -> None:
        """Schedule the next probe turn for when the first suspect is due."""
        try:
            due_in = await self._repo.suspects_due_in()
        except Exception as exc:
            log.warning("could not look for suspect rows: %s", exc)
            due_in = self.config.poll_interval
        if due_in is None:
            self._next_probe = None
            return
        delay = max(due_in, not_before, 0.0)
        self._next_probe = time.monotonic() + delay
        asyncio.get_running_loop().call_later(delay, self.wake)

    def _can_listen(self) -> bool:
        return bool(self.listener and self.listener.connected and not self._stopping)

    def _listener_state(self, connected: bool) -> None:
        self.metrics.listener_connected.set(1 if connected else 0)
        if not connected and self.idle_announced:
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

    async def _maintenance_loop(self, first_pass: asyncio.Event) -> None:
        while True:
            try:
                await self.maintenance_once()
            except Exception as exc:
                log.error("outbox maintenance failed: %s", exc, exc_info=True)
            first_pass.set()
            await asyncio.sleep(self.config.maintenance_interval)

    async def maintenance_once(self) -> dict[str, Any]:
        """Settle the journal of batches that never did; plan probes; refresh the gauges."""
        if not await self.idle_flag.check() and self._can_listen():
            self.wake()  # the flag died with its session: an empty claim takes it again
        found = await self._repo.recover_batches()
        if found.foreign:
            log.warning(
                "discarded %d batch journal rows of another cluster (restored from a dump?): "
                "their transactions cannot be read here; the rows they name are due as usual",
                found.foreign,
            )
        if found.retried or found.dead:
            self.metrics.recovered.labels("retry").inc(found.retried)
            self.metrics.recovered.labels("dlq").inc(found.dead)
            log.warning(
                "counted an attempt for rows that did not settle when claimed alone",
                extra={"retried": found.retried, "dead_lettered": found.dead},
            )
        if found.suspects:
            self.metrics.recovered.labels("suspect").inc(found.suspects)
            log.warning(
                "rows of batches that did not settle come back one at a time, uncharged",
                extra={"suspects": found.suspects},
            )
        await self._plan_probes()
        vacuumed = await self._vacuum.run_once()
        counts = await self._repo.status_counts()
        for status in STATUSES:
            self.metrics.outbox_depth.labels(status).set(counts.by_status.get(status, 0))
        self.metrics.outbox_depth.labels("IN_FLIGHT").set(counts.in_flight)
        return {
            "retried": found.retried,
            "dead": found.dead,
            "suspects": found.suspects,
            "foreign": found.foreign,
            "vacuumed": vacuumed,
        }
