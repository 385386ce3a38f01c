"""outbox-dispatcher: PostgreSQL transactional outbox -> sharded Redis Streams -> workers.

The public API. Applications call ``enqueue_dispatch`` (or its async twin)
inside their own transaction; ``OutboxEnqueuer`` and ``Worker`` are the two
long-running halves, normally run through the ``dispatcher`` command.
"""

from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.outbox import (
    EnqueuerConfig,
    OutboxEnqueuer,
    enqueue_dispatch,
    enqueue_dispatch_async,
)
from dispatcher.stream import (
    RedisStreamConsumer,
    RedisStreamPublisher,
    queue_streams,
    shard_for,
    task_stream,
)
from dispatcher.worker import Worker, WorkerConfig

__all__ = [
    "EnqueuerConfig",
    "OutboxEnqueuer",
    "RedisStreamConsumer",
    "RedisStreamPublisher",
    "TaskDispatch",
    "TaskMessage",
    "Worker",
    "WorkerConfig",
    "enqueue_dispatch",
    "enqueue_dispatch_async",
    "queue_streams",
    "shard_for",
    "task_stream",
]
