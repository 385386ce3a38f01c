"""The worker's settings as one immutable value, validated once at construction.

The worker's layer of settings; ``dispatcher.config`` (its twin by name) is the
process-wide layer every command reads from the environment.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from dispatcher.options import check_bounds, option
from dispatcher.stream.naming import WORKER_GROUP, validate_queue

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
    group: str = option(WORKER_GROUP, help="the consumer group to read through")
    consumer: str = field(default_factory=default_consumer_name)
    concurrency: int = option(8, minimum=1, help="handlers running at once")
    max_runs: int = option(
        5,
        minimum=1,
        aliases=("--max-deliveries",),
        help="handler runs of one task attempt, then it is dead-lettered; --max-deliveries "
        "is its old name, same meaning",
    )
    reclaim_idle: float = option(
        30.0,
        minimum=0,
        above=True,
        help="seconds an entry may sit unacked before a worker reclaims it",
    )
    lease_ttl: float = option(
        30.0,
        minimum=0,
        above=True,
        help="seconds the lease of a run lasts (kept fresh while it runs); the attempts of a "
        "worker that died run again after it",
    )
    handler_timeout: float = option(
        0.0, minimum=0, help="seconds a run may take, then it counts as failed; 0 = no limit"
    )
    dedup_window: float = option(
        24 * 3600.0, minimum=0, above=True, help="seconds a done attempt is remembered"
    )
    shards: int | None = None
    shard_poll_interval: float = 2.0
    stats_interval: float = 5.0
    grace_period: float = option(
        30.0, minimum=0, help="seconds running handlers get to finish after SIGTERM"
    )
    block_ms: int = 1000

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("at least one queue is required")
        for queue in self.queues:
            validate_queue(queue)
        check_bounds(self)
        if self.block_ms < 1 or self.shard_poll_interval <= 0:
            raise ValueError("block ms must be >= 1 and the shard poll interval > 0")
        if not self.group or not self.consumer:
            raise ValueError("group and consumer names must not be empty")

    @property
    def reclaim_idle_ms(self) -> int:
        return max(int(self.reclaim_idle * 1000), 1)
