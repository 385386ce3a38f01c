"""What happens to a claimed row after its publish: pure decisions, no I/O.

``ClaimedRow`` is one row of a batch's claim; ``plan_outcomes`` sorts a batch
by its publish results into rows to delete (sent), to retry after a backoff,
to dead-letter (out of attempts, or naming no task stream: it never could be
published) and to hold back (Redis is full). The
repository applies the ``Outcomes`` in the batch's transaction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.exceptions import OutOfMemoryError

from dispatcher.outbox.backoff import DEFAULT_MAX_RETRIES, retry_delay
from dispatcher.stream.entries import PublishResult
from dispatcher.stream.naming import NotATaskStream

__all__ = [
    "ClaimedRow",
    "Outcomes",
    "Retry",
    "is_out_of_memory",
    "plan_outcomes",
]


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: str
    stream: str
    payload: str | None
    attempt_count: int
    max_retries: int
    backoff_seconds: int
    age_seconds: float
    task_id: str | None = None  # picks the shard when published


@dataclass(frozen=True, slots=True)
class Retry:
    id: str
    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, slots=True)
class Outcomes:
    sent: list[str] = field(default_factory=list)
    retry: list[Retry] = field(default_factory=list)
    dead: list[Retry] = field(default_factory=list)
    # Refused because Redis is full: left as they were (no attempt counted) for when it
    # has room again; an OOM says nothing about the row.
    held: list[str] = field(default_factory=list)


def plan_outcomes(
    rows: Sequence[ClaimedRow],
    results: Sequence[PublishResult],
    rng: random.Random | None = None,
) -> Outcomes:
    """Sort published rows into sent / retry / dead by their publish results."""
    out = Outcomes()
    for row, result in zip(rows, results, strict=True):
        if result.ok:
            out.sent.append(row.id)
            continue
        if is_out_of_memory(result.error):
            out.held.append(row.id)
            continue
        attempt = row.attempt_count + 1
        limit = row.max_retries if row.max_retries > 0 else DEFAULT_MAX_RETRIES
        error = _describe(result.error)
        if attempt > limit or isinstance(result.error, NotATaskStream):
            out.dead.append(Retry(row.id, attempt, 0.0, error))
        else:
            out.retry.append(
                Retry(row.id, attempt, retry_delay(row.backoff_seconds, attempt, rng), error)
            )
    return out


def is_out_of_memory(error: BaseException | None) -> bool:
    """Redis refused a write because it reached ``maxmemory`` (``OOM command not allowed``)."""
    return isinstance(error, OutOfMemoryError) or str(error).startswith("OOM ")


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "publish returned no entry id"
    text = str(error).strip() or type(error).__name__
    return f"{type(error).__name__}: {text}"[:1000]
