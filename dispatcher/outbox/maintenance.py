"""The enqueuer's periodic pass over the database: the batch journal and the depth gauges.

``recover`` settles the journal of batches that never did (an enqueuer
crashed, hung or lost PostgreSQL mid-batch) and says what it did with their
rows; ``refresh_depth`` sets the outbox depth gauges. The scheduler runs both
every maintenance interval, with the vacuum and the probe planning.
"""

from __future__ import annotations

import logging

from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.repository import STATUSES, OutboxRepository, Recovery

__all__ = ["recover", "refresh_depth"]

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
