"""``Worker``: consume a queue's shard streams, run the handler, settle each entry.

One worker process reads every shard stream of its queues (``streams.py``),
each with its own read and reclaim loops (``reader.py``), and runs handlers
in one bounded pool of slots (``slots.py``): each read batch is one task that
claims all its entries at once, starts their handlers and settles them
together (``delivery.py``); entries that wait for their queue's limits
(``limit_gate.py``) are started again by a loop per queue, as the limits make
room (``waiting.py``); long runs keep their leases and their entries
fresh (``leases.py``), and a thread warns when the event loop stalls for
long enough to let them lapse (``stalls.py``). ``request_stop()`` stops reading; handlers in hand
finish within the grace period, the rest stay pending for another worker; a
consumer with nothing pending is then removed from its group. Until
``run()`` returns, every handler still running keeps its lease and its entry
fresh; a thread cannot be stopped (a sync handler's, or one an async handler
waits for), so once the grace period ran out (``cut_short`` names the runs it
cut short, ``abandoned`` counts the sync handler threads still running) the
process should end at once (the CLI exits hard): never wait for those threads
while their leases lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.stats import stream_stats
from dispatcher.worker.calls import HandlerCalls
from dispatcher.worker.cancels import RunCancels
from dispatcher.worker.coalesce import Coalescer
from dispatcher.worker.dedup import AttemptGuard
from dispatcher.worker.delivery import Deliveries
from dispatcher.worker.handler import Handler
from dispatcher.worker.leases import LeaseKeeper
from dispatcher.worker.limit_gate import LimitGate
from dispatcher.worker.limit_scripts import LimitScripts
from dispatcher.worker.settle import Settler
from dispatcher.worker.side_renewal import SideRenewal
from dispatcher.worker.slots import SlotPool
from dispatcher.worker.stalls import LoopWatch
from dispatcher.worker.streams import WorkerStreams
from dispatcher.worker.task_set import HandlingSet, LoopSet, RedisContact
from dispatcher.worker.verdicts import Verdicts
from dispatcher.worker.waiting import WaitingRoom
from dispatcher.worker.worker_config import WorkerConfig
from dispatcher.worker.worker_metrics import WorkerMetrics

__all__ = ["Worker"]

log = logging.getLogger(__name__)

# Without an answer from Redis for this long a worker leaves rotation (readiness), ...
REDIS_UNREADY_AFTER = 15.0
# ... and only after this long is it presumed stuck (liveness): a Redis failover can take
# minutes, and restarting every worker for it only adds a storm of reconnects.
REDIS_DEAD_AFTER = 600.0


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
        self._handler = handler
        self._stopping = asyncio.Event()
        self._loops = LoopSet()
        self._keepers = LoopSet()  # they run until the end, the loops only until the drain
        self._handling = HandlingSet()
        self._contact = RedisContact(clock)
        self._slots = SlotPool(config.concurrency)
        self._executor = ThreadPoolExecutor(config.concurrency, thread_name_prefix="handler")
        guard = AttemptGuard(
            client,
            owner=config.consumer,
            lease_ttl_ms=int(config.lease_ttl * 1000),
            done_ttl_ms=int(config.dedup_window * 1000),
        )
        self._waiting = WaitingRoom(slots=self._slots, reclaim_idle=config.reclaim_idle)
        self._limits = LimitGate(
            client,
            LimitScripts(client, guard, max_runs=config.max_runs),
            queues=config.queues,
            slots=self._slots,
            waiting=self._waiting,
            max_runs=config.max_runs,
            lease_ttl=config.lease_ttl,
            registry=self.metrics.registry,
            outage=self._contact.outage,
        )
        self._deliveries = self._make_deliveries(guard)
        self._streams = WorkerStreams(
            client=client,
            config=config,
            metrics=self.metrics,
            slots=self._slots,
            deliveries=self._deliveries,
            stopping=self._stopping,
            contact=self._contact,
            loops=self._loops,
            limits=self._limits,
        )
        self._started = False
        self._cut_short: tuple[str, ...] = ()
        calls = self._deliveries.calls
        self._side = SideRenewal(calls.leases.guard, held=calls.leases.running_keys)
        self._watch = LoopWatch(
            threshold=config.lease_ttl / 3,
            what="the leases of runs in progress are renewed from a thread meanwhile, but the "
            "entries in hand go stale (another worker may reclaim them, and leaves them "
            "pending) and nothing else of this worker runs",
            while_stalled=self._side.renew,
        )

    # -- public surface -------------------------------------------------------

    @property
    def streams(self) -> list[str]:
        return list(self._streams.readers)

    @property
    def shards(self) -> int:
        return self._streams.shards

    @property
    def abandoned(self) -> int:
        """Sync handler threads still running (after ``run()``: left behind by the grace period)."""
        return len(self._deliveries.calls.threads)

    @property
    def cut_short(self) -> tuple[str, ...]:
        """The attempts (dedup keys) whose runs the grace period cut short; empty if none."""
        return self._cut_short

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
        return self._loops.any_done() or self._keepers.any_done()

    def _redis_silent_for(self) -> float:
        return self._contact.silent_for()

    async def run(self) -> None:
        """Read and handle until ``request_stop()``; then drain and leave the groups."""
        try:
            self._deliveries.cancels.activate()  # cancel_requested() in handlers of this worker
            self._watch.start()
            await self._start()
            await self._stopping.wait()
            log.info(
                "stopping: no new reads; waiting for handlers in hand",
                extra={"consumer": self.config.consumer},
            )
            await self._drain()
            await self._streams.leave_groups()
            await self._limits.renew()  # the slots still held: none once every run ended
        finally:
            await self._cancel({*self._loops, *self._handling, *self._keepers})
            await self._deliveries.claims.aclose()
            await self._deliveries.verdicts.settler.aclose()
            # A sync handler still running past the grace period cannot be
            # interrupted: we stop waiting for it, its entry stays pending, and
            # the caller ends the process (``abandoned``).
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._watch.stop()
            self._side.close()
            log.info("worker stopped", extra={"consumer": self.config.consumer})

    # -- start-up -------------------------------------------------------------

    def _make_deliveries(self, guard: AttemptGuard) -> Deliveries:
        calls = HandlerCalls(
            handler=self._handler,
            leases=LeaseKeeper(guard, reclaim_idle=self.config.reclaim_idle),
            handler_timeout=self.config.handler_timeout,
            executor=self._executor,
        )
        verdicts = Verdicts(
            client=self.client,
            guard=guard,
            settler=Settler(self.client, guard),
            metrics=self.metrics,
            max_runs=self.config.max_runs,
        )
        return Deliveries(
            claims=Coalescer(guard.claim_many, name="claim"),
            calls=calls,
            verdicts=verdicts,
            cancels=RunCancels(
                verdicts, block_ms=self.config.block_ms, outage=self._contact.outage
            ),
            metrics=self.metrics,
            max_runs=self.config.max_runs,
            handling=self._handling,
            limits=self._limits,
        )

    async def _start(self) -> None:
        await self._deliveries.verdicts.guard.check()
        await self._limits.refresh()  # limits in force before the first read
        await self._deliveries.cancels.check()
        shards = await self._streams.start()
        self._contact.ok()
        # Not among the loops: they renew the leases and the limit slots of handlers still
        # draining after the loops stopped.
        self._keepers.start(self._deliveries.calls.leases.run(), "lease keeper")
        self._keepers.start(self._limits.run(), "queue limits")
        self._loops.start(self._streams.watch(), "shard watch")
        self._loops.start(self._report_stats(), "stream stats")
        self._loops.start(self._deliveries.cancels.watch(self._stopping), "cancel watch")
        for queue in self.config.queues:
            self._loops.start(self._retry_waiting(queue), f"waiting {queue}")
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

    async def _report_stats(self) -> None:
        while not await self._stopped_within(self.config.stats_interval):
            for stream, reader in list(self._streams.readers.items()):
                try:
                    stats = await stream_stats(self.client, stream, self.config.group)
                except (RedisError, OSError) as exc:
                    if not self._contact.outage.failed(exc, what="reading stream stats"):
                        log.warning("cannot read stream stats: %s", exc, extra={"stream": stream})
                    break
                self.metrics.observe_stream(reader.queue, stats)
                self._contact.ok()

    # -- handling ---------------------------------------------------------------

    async def _retry_waiting(self, queue: str) -> None:
        """Start the entries of ``queue`` that wait for its limits again as room frees."""
        async for reader, batch in self._waiting.released(queue, stopping=self._stopping):
            try:
                await self._deliveries.take_waiting(reader, batch)
            except Exception as exc:  # never the waiting loop's end: others still wait
                log.error("cannot retry waiting entries: %s", exc, exc_info=exc)

    # -- shutdown -----------------------------------------------------------------

    async def _drain(self) -> None:
        """Let loops exit and handlers finish, all within the grace period."""
        deadline = time.monotonic() + self.config.grace_period
        if self._loops:
            await asyncio.wait(set(self._loops), timeout=self.config.grace_period)
        await self._cancel(set(self._loops))
        while self._handling and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(set(self._handling), timeout=left)
        if self._handling or self.abandoned:
            self._cut_short = tuple(self._deliveries.calls.leases.dedup_keys())
        if self._handling:
            log.warning(
                "grace period over: %d entries in hand cancelled; they stay pending "
                "(runs cut short: %s)",
                self._streams.in_hand(),
                ", ".join(self._cut_short) or "none",
            )
            await self._cancel(set(self._handling))
        if self.abandoned:
            log.warning(
                "%d sync handlers still running after the grace period: their leases are "
                "kept until the process exits",
                self.abandoned,
            )

    # -- plumbing -------------------------------------------------------------------

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
