"""Suspect rows claimed one at a time (probes), with nothing else of this process beside.

A batch that never settled (its enqueuer crashed, hung or lost PostgreSQL
mid-batch) is not a verdict on all its rows: maintenance makes them suspects,
uncharged, and each comes back alone in a batch of its own while every batch
slot of this process is held, so a crash during a probe can only be that
row's doing. A probe that never settles counts an attempt for its row: the
row that kills every enqueuer that takes it reaches the DLQ after its
retries, and its batch-mates are published without an attempt charged.
"""

from __future__ import annotations

import logging
import time

from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.pipeline import BatchPipeline
from dispatcher.outbox.repository import OutboxRepository

__all__ = ["PROBES_PER_TURN", "SuspectProbes"]

log = logging.getLogger(__name__)

# Suspects probed in one turn before other batches get the slots back.
PROBES_PER_TURN = 10


class SuspectProbes:
    """When the next probe turn is due, and the turn itself (``run_turn``), which the
    scheduling loop runs with every batch slot held (``BatchSlots.all_held``)."""

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        pipeline: BatchPipeline,
        signals: LoopSignals,
        retry_after: float,
    ) -> None:
        self._repo = repository
        self._pipeline = pipeline
        self._signals = signals
        self._retry_after = retry_after
        self._next: float | None = None  # when suspects are due (monotonic), if any

    def due(self) -> bool:
        return self._next is not None and time.monotonic() >= self._next

    async def run_turn(self) -> None:
        """Claim due suspects one at a time (the caller holds every slot), then plan the next
        turn and ring the loop."""
        failed = False
        try:
            for _ in range(PROBES_PER_TURN):
                if self._signals.stopping or not await self._pipeline.run(probe=True):
                    break
        except Exception:
            log.exception("probing a suspect row failed; recovery counts its attempt")
            failed = True
        await self.plan(not_before=self._retry_after if failed else 0.0)
        self._signals.ring()

    async def plan(self, *, not_before: float = 0.0) -> None:
        """Schedule the next probe turn for when the first suspect is due."""
        try:
            due_in = await self._repo.suspects_due_in()
        except Exception as exc:
            log.warning("could not look for suspect rows: %s", exc)
            due_in = self._retry_after
        if due_in is None:
            self._next = None
            return
        delay = max(due_in, not_before, 0.0)
        self._next = time.monotonic() + delay
        self._signals.ring_in(delay)
