"""The stream layer: shard naming and count, stream entries, publishing and consuming on Redis."""

from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.stream.entries import Fields, Message, PublishResult
from dispatcher.stream.naming import (
    DEAD_STREAM_PREFIX,
    DEFAULT_SHARDS,
    SHARDS_KEY,
    TASK_STREAM_PREFIX,
    InvalidQueueName,
    NotATaskStream,
    Router,
    dead_letter_stream,
    fnv1a_32,
    parse_task_stream,
    queue_of_stream,
    queue_stream,
    queue_streams,
    route_stream,
    shard_for,
    task_stream,
    validate_queue,
)
from dispatcher.stream.publisher import (
    InsufficientReplicas,
    RedisStreamPublisher,
    ensure_group,
    error_code,
)
from dispatcher.stream.shard_count import (
    InvalidShardCount,
    parse_shard_count,
    publish_shard_count,
    read_shard_count,
)

__all__ = [
    "DEAD_STREAM_PREFIX",
    "DEFAULT_SHARDS",
    "SHARDS_KEY",
    "TASK_STREAM_PREFIX",
    "Fields",
    "InsufficientReplicas",
    "InvalidQueueName",
    "InvalidShardCount",
    "Message",
    "NotATaskStream",
    "PublishResult",
    "RedisStreamConsumer",
    "RedisStreamPublisher",
    "Router",
    "dead_letter_stream",
    "ensure_group",
    "error_code",
    "fnv1a_32",
    "parse_shard_count",
    "parse_task_stream",
    "publish_shard_count",
    "queue_of_stream",
    "queue_stream",
    "queue_streams",
    "read_shard_count",
    "route_stream",
    "shard_for",
    "task_stream",
    "validate_queue",
]
