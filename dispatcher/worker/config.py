"""The worker's settings as one immutable value, validated once at construction.

The worker's layer of settings; ``dispatcher.config`` (its twin by name) is the
process-wide layer every command reads from the environment.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from dispatcher.stream.naming import validate_queue

__all__ = ["WorkerConfig", "default_consumer_name"]


def default_consumer_name() -> str:
    """``<hostname>-<pid>``: unique per process, recognisable in XINFO CONSUMERS."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """What one worker process reads and how it treats each delivery.

    Times are in seconds. ``max_runs`` is how many handler runs one task
    attempt gets before it is dead-lettered; ``handler_timeout`` 0 means none.
    ``shards`` is the fallback when ``composer:stream_shards`` is not set yet.
    """

    queues: tuple[str, ...]
    group: str = "workers"
    consumer: str = field(default_factory=default_consumer_name)
    concurrency: int = 8
    max_runs: int = 5
    reclaim_idle: float = 30.0
    lease_ttl: float = 30.0
    handler_timeout: float = 0.0  # 0: none
    dedup_window: float = 24 * 3600.0
    shards: int | None = None
    shard_poll_interval: float = 2.0
    stats_interval: float = 5.0
    grace_period: float = 30.0
    block_ms: int = 1000

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("at least one queue is required")
        for queue in self.queues:
            validate_queue(queue)
        _at_least("concurrency", self.concurrency, 1)
        _at_least("max runs", self.max_runs, 1)
        _at_least("block ms", self.block_ms, 1)
        for name in ("reclaim_idle", "lease_ttl", "dedup_window", "shard_poll_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.replace('_', ' ')} must be > 0")
        if self.grace_period < 0:
            raise ValueError("grace period must be >= 0")
        if self.handler_timeout < 0:
            raise ValueError("handler timeout must be >= 0 (0 = none)")
        if not self.group or not self.consumer:
            raise ValueError("group and consumer names must not be empty")

    @property
    def reclaim_idle_ms(self) -> int:
        return max(int(self.reclaim_idle * 1000), 1)


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
