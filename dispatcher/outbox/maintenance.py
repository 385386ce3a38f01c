"""The enqueuer's periodic pass over the database (``Maintenance``).

Every maintenance interval: check that the idle flag's session still lives,
settle the journal of batches that never did (an enqueuer crashed, hung or
lost PostgreSQL mid-batch; ``recover`` says what it did with their rows),
plan the probes of their suspects, vacuum the outbox when nothing else has
(``OutboxVacuum``) and set the depth gauges (``refresh_depth``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from dispatcher.outbox.idle_flag import IdleFlag
from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.repository import STATUSES, OutboxRepository, Recovery
from dispatcher.outbox.suspect_probes import SuspectProbes
from dispatcher.outbox.vacuum import OutboxVacuum

__all__ = ["Maintenance", "recover", "refresh_depth"]

log = logging.getLogger(__name__)


async def recover(repository: OutboxRepository, metrics: EnqueuerMetrics) -> Recovery:
    """Settle the journal of unsettled batches; count and log what happened to their rows."""
    found = await repository.recover_batches()
    if found.foreign:
        log.warning(
            "discarded %d batch journal rows of another cluster (restored from a dump?): "
            "their transactions cannot be read here; the rows they name are due as usual",
            found.foreign,
        )
    if found.retried or found.dead:
        metrics.recovered.labels("retry").inc(found.retried)
        metrics.recovered.labels("dlq").inc(found.dead)
        log.warning(
            "counted an attempt for rows that did not settle when claimed alone",
            extra={"retried": found.retried, "dead_lettered": found.dead},
        )
    if found.suspects:
        metrics.recovered.labels("suspect").inc(found.suspects)
        log.warning(
            "rows of batches that did not settle come back one at a time, uncharged",
            extra={"suspects": found.suspects},
        )
    return found


async def refresh_depth(repository: OutboxRepository, metrics: EnqueuerMetrics) -> None:
    """Outbox rows by status, and rows held by open batches, into the depth gauges."""
    counts = await repository.status_counts()
    for status in STATUSES:
        metrics.outbox_depth.labels(status).set(counts.by_status.get(status, 0))
    metrics.outbox_depth.labels("IN_FLIGHT").set(counts.in_flight)


class Maintenance:
    """The pass (``run_once``) and its loop, ``every`` seconds; it rings ``signals`` for a
    claim when the idle flag was lost."""

    def __init__(
        self,
        *,
        repository: OutboxRepository,
        metrics: EnqueuerMetrics,
        flag: IdleFlag,
        probes: SuspectProbes,
        vacuum_threshold: int,
        every: float,
        signals: LoopSignals,
    ) -> None:
        self._repo = repository
        self._metrics = metrics
        self._flag = flag
        self._probes = probes
        self._vacuum = OutboxVacuum(repository.pool, threshold=vacuum_threshold)
        self._every = every
        self._signals = signals

    async def loop(self, first_pass: asyncio.Event) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:
                log.error("outbox maintenance failed: %s", exc, exc_info=True)
            first_pass.set()
            await asyncio.sleep(self._every)

    async def run_once(self) -> dict[str, Any]:
        if not await self._flag.check() and self._signals.can_listen():
            self._signals.ring()  # the flag died with its session: an empty claim takes it again
        found = await recover(self._repo, self._metrics)
        await self._probes.plan()
        vacuumed = await self._vacuum.run_once()
        await refresh_depth(self._repo, self._metrics)
        return {**dataclasses.asdict(found), "vacuumed": vacuumed}
