"""outbox-dispatcher: PostgreSQL transactional outbox -> sharded Redis Streams -> workers.

The public API. Applications call ``enqueue_dispatch`` and ``cancel_run`` (or
their async twins) inside their own transaction; handlers may poll
``cancel_requested``; ``OutboxEnqueuer`` and ``Worker`` are the two
long-running halves, normally run through the ``dispatcher`` command.
"""

from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.outbox import (
    EnqueuerConfig,
    OutboxEnqueuer,
    cancel_run,
    cancel_run_async,
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
from dispatcher.worker import Worker, WorkerConfig, cancel_requested

__all__ = [
    "EnqueuerConfig",
    "OutboxEnqueuer",
    "RedisStreamConsumer",
    "RedisStreamPublisher",
    "TaskDispatch",
    "TaskMessage",
    "Worker",
    "WorkerConfig",
    "cancel_requested",
    "cancel_run",
    "cancel_run_async",
    "enqueue_dispatch",
    "enqueue_dispatch_async",
    "queue_streams",
    "shard_for",
    "task_stream",
]
