"""The enqueuer's settings, one frozen value: validated once, split for each part.

``batch_settings`` is what a claim batch needs, ``idle_policy`` what the idle
flag decides by. Their defaults are theirs (``BatchSettings``, ``IdlePolicy``):
the fields here that they share start from them, so each default is written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.options import option
from dispatcher.outbox.backpressure import MemoryMarks
from dispatcher.outbox.idle_flag import IdlePolicy
from dispatcher.outbox.pipeline import BatchSettings

__all__ = ["EnqueuerConfig"]

_BATCH = BatchSettings()
_IDLE = IdlePolicy()


@dataclass(frozen=True, slots=True)
class EnqueuerConfig:
    batch_size: int = option(_BATCH.batch_size, minimum=1, help="rows per claim (one transaction)")
    concurrency: int = option(4, minimum=1, help="batches in flight at once")
    poll_interval: float = option(
        1.0, minimum=0.01, help="seconds between polls when no NOTIFY wakes the enqueuer"
    )
    hung_batch_timeout: float = option(
        _BATCH.hold_for,
        minimum=1,
        aliases=("--recover-in-flight-after",),
        help="seconds a batch may hang before PostgreSQL ends its transaction and its rows "
        "are due again (must exceed --publish-timeout); --recover-in-flight-after is its "
        "old name, same meaning",
    )
    maintenance_interval: float = option(
        30.0,
        minimum=0.1,
        help="seconds between runs that count the attempts of batches that never settled",
    )
    wait_replicas: int = option(
        _BATCH.wait_replicas,
        minimum=0,
        help="Redis replicas that must acknowledge a batch (WAIT) before its rows are deleted",
    )
    wait_timeout_ms: int = _BATCH.wait_timeout_ms
    publish_timeout: float = option(
        _BATCH.publish_timeout, minimum=0.1, help="seconds to publish one batch"
    )
    shutdown_timeout: float = option(
        30.0, minimum=0, help="seconds to finish in-flight batches after SIGTERM"
    )
    listener_rotate_after: float = 600.0
    # The idle flag's policy (see IdlePolicy for each).
    busy_at_rows: int = _IDLE.busy_at_rows
    idle_confirm_after: float = _IDLE.idle_confirm_after
    linger: float = _IDLE.linger
    blocked_claim_every: float = _IDLE.blocked_claim_every
    blocked_backoff_after: float = _IDLE.blocked_backoff_after
    redis_memory_high: float = option(
        0.85,
        minimum=0,
        help="share of Redis maxmemory at which claims pause and rows wait in the outbox "
        "(no attempt counted); 0 = never pause",
    )
    redis_memory_low: float = option(
        0.75, minimum=0, help="share of Redis maxmemory below which paused claims resume"
    )
    vacuum_threshold: int = option(
        10_000,
        minimum=0,
        help="dead tuples in the outbox past which maintenance vacuums it when nothing else "
        "has for a minute (autovacuum off or starved); 0 = leave it to autovacuum",
    )

    dedup_window: float = option(
        24 * 3600.0,
        minimum=0,
        above=True,
        help="seconds a cancelled run stays cancelled for the workers (give it the workers' "
        "--dedup-window)",
    )

    def __post_init__(self) -> None:
        MemoryMarks(self.redis_memory_high, self.redis_memory_low)  # validates them
        if self.batch_size < 1 or self.concurrency < 1:
            raise ValueError("batch size and concurrency must be >= 1")
        if self.poll_interval <= 0 or self.maintenance_interval <= 0:
            raise ValueError("poll and maintenance intervals must be > 0")
        if self.hung_batch_timeout <= self.publish_timeout:  # it bounds WAIT too
            raise ValueError(
                "hung-batch-timeout must exceed the publish timeout "
                f"({self.publish_timeout:g} s), or PostgreSQL would end batches still publishing"
            )

    def batch_settings(self) -> BatchSettings:
        return BatchSettings(
            batch_size=self.batch_size,
            hold_for=self.hung_batch_timeout,
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
