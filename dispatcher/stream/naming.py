"""Queue and shard naming: which Redis stream carries a task.

Pure functions, no I/O. A queue is split into ``shards`` streams named
``workflow.tasks.<queue>.<shard>``; a task goes to the shard picked by the
FNV-1a 32-bit hash of its id (bit-for-bit Go's ``hash/fnv`` New32a), so a Go
coordinator and this package agree on every stream name.

An outbox row stores its queue's stream (``workflow.tasks.<queue>``, or with a
shard number as older writers put it); ``route_stream`` picks the shard when
the row is published, from the count in force at that moment, so rows waiting
for a retry or a ``not_before`` follow a change of the count. A row's stream is
written by the application, so it is trusted for nothing more: any other name
(a control key such as ``workflow.cancel.runs`` or ``composer:limits:{q}``) is
``NotATaskStream``, never published (the schema refuses such rows too, migration
0012, with the same pattern as ``TASK_STREAM_PATTERN``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# FNV-1a 32-bit hash (in C), the same numbers as Go's ``fnv.New32a``, for every row
# published: 0.1 us for a uuid where a Python loop took 4 us (2026-12-03;
# benchmarks/NOTES.md, "Figures the code's comments quote").
from fnv_hash_fast import fnv1a_32

__all__ = [
    "DEAD_STREAM_PREFIX",
    "DEFAULT_SHARDS",
    "SHARDS_KEY",
    "SHARDS_OWNER_KEY",
    "TASK_STREAM_PATTERN",
    "TASK_STREAM_PREFIX",
    "WORKER_GROUP",
    "InvalidQueueName",
    "NotATaskStream",
    "Router",
    "dead_letter_stream",
    "fnv1a_32",
    "parse_task_stream",
    "queue_of_stream",
    "queue_stream",
    "queue_streams",
    "route_stream",
    "shard_for",
    "task_stream",
    "validate_queue",
]

TASK_STREAM_PREFIX = "workflow.tasks."
DEAD_STREAM_PREFIX = "workflow.dead."
DEFAULT_SHARDS = 4
SHARDS_KEY = "composer:stream_shards"
# Which OutboxDispatcher (namespace/name/uid, JSON) writes SHARDS_KEY of this Redis database:
# the operator's marker, so two resources on one database never fight over the count.
SHARDS_OWNER_KEY = "composer:stream_shards:owner"
# The consumer group the enqueuer creates on every task stream and workers read through.
WORKER_GROUP = "workers"

# A queue name must keep ``<prefix><queue>.<shard>`` unambiguous: no dots
# (``a.1`` + shard 2 would read as queue ``a`` shard ``1.2``), no whitespace,
# no braces (a Redis Cluster hash tag would pin every shard to one slot). Without dots a
# queue name can never end in ``.<digits>``, so ``workflow.tasks.<queue>`` and
# ``workflow.tasks.<queue>.<n>`` never read as each other.
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
# What a row's ``stream`` may be: ``workflow.tasks.<queue>``, or ``.<n>`` after it as older
# writers put it (ASCII digits only). The CHECK of migration 0012 is this pattern, anchored.
TASK_STREAM_PATTERN = r"workflow\.tasks\.([A-Za-z0-9_-]{1,200})(\.[0-9]+)?"
_TASK_STREAM_RE = re.compile(TASK_STREAM_PATTERN)


class InvalidQueueName(ValueError):
    """A queue name that cannot be turned into an unambiguous stream name."""


class NotATaskStream(ValueError):
    """A row names a stream that is not a task queue's: it is never published."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"{stream[:200]!r} is not a task stream (workflow.tasks.<queue>): "
            "refused, nothing written to Redis"
        )


def validate_queue(queue: str) -> str:
    """Return ``queue`` unchanged if it is a valid queue name, else raise."""
    if not isinstance(queue, str) or not _QUEUE_RE.fullmatch(queue):
        raise InvalidQueueName(
            f"invalid queue name {queue!r}: use 1-200 characters from "
            "letters, digits, '_' and '-' (no dots, spaces or braces)"
        )
    return queue


def shard_for(task_id: str, shards: int) -> int:
    """Pick the shard of a task: FNV-1a 32 of its UTF-8 id modulo ``shards``."""
    if shards <= 1:
        return 0
    return fnv1a_32(task_id.encode("utf-8")) % shards


def task_stream(queue: str, shard: int) -> str:
    """Name of one shard stream of a task queue."""
    validate_queue(queue)
    if shard < 0:
        raise ValueError(f"shard must be >= 0, got {shard}")
    return f"{TASK_STREAM_PREFIX}{queue}.{shard}"


def queue_stream(queue: str) -> str:
    """The stream an outbox row names for its queue; the shard is chosen when published."""
    return f"{TASK_STREAM_PREFIX}{validate_queue(queue)}"


def queue_of_stream(stream: str) -> str | None:
    """The queue of ``workflow.tasks.<queue>`` or ``workflow.tasks.<queue>.<n>``, else None."""
    found = _TASK_STREAM_RE.fullmatch(stream)
    return found.group(1) if found else None


def route_stream(stream: str, task_id: str, shards: int) -> str:
    """The shard stream a row stored with ``stream`` is published to at ``shards`` shards.

    Raise ``NotATaskStream`` for any other name: a row never names a key of its own choosing.
    """
    return Router(shards)(stream, task_id)


class Router:
    """``route_stream`` at one shard count, for many rows: each stored stream is parsed once.

    A batch of rows names a handful of streams; the names of their shard
    streams are made once per router, so a row costs a dictionary lookup and
    its hash.
    """

    __slots__ = ("_names", "_shards")

    def __init__(self, shards: int) -> None:
        self._shards = max(shards, 1)
        # stored stream -> the names of its shard streams
        self._names: dict[str, list[str]] = {}

    @property
    def shards(self) -> int:
        return self._shards

    def __call__(self, stream: str, task_id: str) -> str:
        names = self._names.get(stream)
        if names is None:
            names = self._names[stream] = self._shard_names(stream)
        if len(names) == 1:
            return names[0]
        return names[fnv1a_32(task_id.encode("utf-8")) % self._shards]

    def _shard_names(self, stream: str) -> list[str]:
        queue = queue_of_stream(stream)
        if queue is None:
            raise NotATaskStream(stream)
        return [task_stream(queue, shard) for shard in range(self._shards)]


def queue_streams(queues: Iterable[str], shards: int) -> list[str]:
    """Every shard stream of the given queues, queue by queue, shard by shard."""
    shards = max(shards, 1)
    return [task_stream(q, s) for q in queues for s in range(shards)]


def parse_task_stream(stream: str) -> tuple[str, int]:
    """Split a task stream name back into ``(queue, shard)``; raise if it is not one."""
    if not stream.startswith(TASK_STREAM_PREFIX):
        raise ValueError(f"not a task stream: {stream!r}")
    queue, _, shard = stream[len(TASK_STREAM_PREFIX) :].rpartition(".")
    if not shard.isdigit():
        raise ValueError(f"not a task stream: {stream!r}")
    return validate_queue(queue), int(shard)


def dead_letter_stream(queue: str) -> str:
    """The worker dead-letter stream of a queue."""
    return f"{DEAD_STREAM_PREFIX}{validate_queue(queue)}"
