"""The enqueuer's batch slots: at most ``concurrency`` batches at once, and what each one does.

A slot runs a batch top to bottom (``BatchPipeline.claimed``): publish, then settle; while
batches come back full and publish whole (a backlog), it settles each in the claim of the next
(one round trip for both, up to ``CHAIN_MAX`` in a row), unless the enqueuer is stopping, a
probe turn is due or Redis is full or without AOF (the scheduling loop decides then). After
each claim the idle flag is told what it found (``IdleFlag.after_claim``), which says when to
claim next; the slot rings the loop's ``LoopSignals`` then.

A hint (an empty notification) that finds the enqueuer idle starts its batch here at once,
without the loop's turn (the idle dispatch's latency); one that finds a batch running rings
the loop, so a flood of hints costs no more claims than one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from dispatcher.outbox.backpressure import RedisMemoryGate
from dispatcher.outbox.durability import AofWatch
from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.pipeline import BatchPipeline
from dispatcher.outbox.suspect_probes import SuspectProbes

__all__ = ["CHAIN_MAX", "BatchSlots"]

log = logging.getLogger(__name__)

# Full batches a slot claims in its previous batch's settlement before it hands the slot back
# to the scheduling loop (which checks for due suspects, the memory gate and stopping between
# batches too). One claim round trip less per batch while draining.
CHAIN_MAX = 32


class BatchSlots:
    """``concurrency`` slots, the batches running in them, and whether the last was full."""

    def __init__(
        self,
        *,
        concurrency: int,
        pipeline: BatchPipeline,
        probes: SuspectProbes,
        memory: RedisMemoryGate,
        durability: AofWatch,
        idle_flag: IdleFlag,
        signals: LoopSignals,
    ) -> None:
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._pipeline = pipeline
        self._probes = probes
        self._memory = memory
        self._durability = durability
        self._idle_flag = idle_flag
        self._signals = signals
        self.running: set[asyncio.Task[int]] = set()
        # Until the loop opens them (after the first maintenance pass settled the journal a
        # crash left), a hint starts nothing: it rings, and the loop claims once it runs.
        self._open = False
        self.backlog = False  # the last batch came back full: fill every free slot at once
        self.heartbeat = time.monotonic()  # the last claim (or the loop's last turn)

    def open(self) -> None:
        """From the loop's first turn: hints may start batches."""
        self._open = True

    async def start(self) -> bool:
        """Wait for a free slot and start a batch in it; False if stopping meanwhile."""
        await self._slots.acquire()
        if self._signals.stopping:
            self._slots.release()
            return False
        self._spawn(self.batch_in_slot())
        return True

    def hinted(self) -> None:
        """A notification: start a batch at once if the loop would start just that one
        (the slots opened, nothing running, no backlog, nothing due, Redis with room at the
        last reading); else ring the loop. Standing by (the flag is held elsewhere): nothing."""
        if self._idle_flag.elsewhere:
            return
        if (
            not self._open
            or self.running
            or self.backlog
            or self._signals.stopping
            or self._probes.due()
            or not self._memory.open_now()
            or not self._durability.open_now()
        ):
            self._signals.ring()
            return
        self._spawn(self.batch_in_slot(acquire=True))

    @contextlib.asynccontextmanager
    async def all_held(self) -> AsyncIterator[None]:
        """Every slot held for the block: nothing else of this process runs beside."""
        for _ in range(self.concurrency):
            await self._slots.acquire()
        try:
            yield
        finally:
            for _ in range(self.concurrency):
                self._slots.release()

    async def batch_in_slot(self, *, acquire: bool = False) -> int:
        """One slot's batches, the chain while a backlog lasts; how many rows the last held.
        The slot is given back at the end (taken first with ``acquire``: started from a hint,
        it waits if the loop took the slot)."""
        if acquire:
            await self._slots.acquire()
        started = time.monotonic()
        chained = count = 0
        try:
            async with self._pipeline.claimed() as run:
                while count := len(run):
                    await run.publish()
                    if not (run.whole and await self._may_chain(chained)):
                        await run.settle()
                        break
                    chained += 1
                    await self._after_claim(count, started)
                    started = self.heartbeat = time.monotonic()
                    if not await run.settle_and_claim_next():
                        break
        except Exception:
            log.exception("outbox batch failed; its rows are retried or recovered")
            count = 0
        finally:
            self._slots.release()
        await self._after_claim(count, started)
        return count

    async def drain(self, within: float) -> None:
        """Let running batches finish; past ``within`` seconds cancel them (their rows roll
        back)."""
        if not self.running:
            return
        _, late = await asyncio.wait(self.running, timeout=within)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        if late:
            log.warning("cancelled %d unfinished batches at shutdown", len(late))

    def _spawn(self, batch: Coroutine[Any, Any, int]) -> None:
        task = asyncio.get_running_loop().create_task(batch)
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _may_chain(self, chained: int) -> bool:
        """A full batch published whole: claim the next in its settlement, unless held back."""
        try:
            return not (
                self._signals.stopping
                or chained >= CHAIN_MAX
                or self._probes.due()
                or not await self._memory.allows()
                or not await self._durability.allows()
            )
        except Exception:  # the batch published: it settles, whatever the answer
            log.exception("could not decide on claiming the next batch; settling this one")
            return False

    async def _after_claim(self, count: int, started: float) -> None:
        full = count >= self._pipeline.settings.batch_size
        self.backlog = full
        try:
            delay = await self._idle_flag.after_claim(
                count=count,
                started=started,
                ended=time.monotonic(),
                full=full,
                can_listen=self._signals.can_listen(),
            )
        except Exception as exc:
            log.warning("could not update the idle flag: %s", exc)
            delay = None  # the poll claims next
        if delay is not None:
            self._signals.ring_in(delay)
