"""The enqueuer's settings, one frozen value: validated once, split for each part.

``batch_settings`` is what a claim batch (and a publish from notifications)
needs, ``idle_policy`` what the idle flag decides by.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.outbox.backpressure import MemoryMarks
from dispatcher.outbox.idle_flag import IdlePolicy
from dispatcher.outbox.pipeline import BatchSettings

__all__ = ["EnqueuerConfig"]


@dataclass(frozen=True, slots=True)
class EnqueuerConfig:
    batch_size: int = 100
    concurrency: int = 4
    poll_interval: float = 1.0
    # A batch's transaction idle longer than this (a paused or hung enqueuer) is ended by
    # PostgreSQL and its rows are due again.
    recover_in_flight_after: float = 30.0
    maintenance_interval: float = 30.0
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    publish_timeout: float = 10.0
    shutdown_timeout: float = 30.0
    listener_rotate_after: float = 600.0
    # The idle flag's policy (see IdlePolicy for each).
    busy_at_rows: int = 2
    idle_confirm_after: float = 0.005
    linger: float = 0.002
    blocked_claim_every: float = 0.005
    blocked_backoff_after: float = 2.0
    # Stop claiming at this share of Redis maxmemory, resume below the low one (0 = never).
    redis_memory_high: float = 0.85
    redis_memory_low: float = 0.75
    # Maintenance vacuums the outbox past this many dead tuples when nothing else has for a
    # minute (autovacuum off or starved); 0 = leave it to autovacuum.
    vacuum_threshold: int = 10_000

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
