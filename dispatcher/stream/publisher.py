"""Publish entries to Redis Streams: one pipelined round trip per batch (per node).

``publish_many`` queues every XADD of a batch in one non-transactional
pipeline. On Redis Cluster, redis-py groups a pipeline's commands by node and
sends each node its share in one round trip, concurrently. Results are per
entry: a failed XADD (wrong type, OOM, a node down) is reported for that entry
alone. With ``wait_replicas`` a ``WAIT`` rides in the same pipeline, on the
same connection, after the writes of each node, so an entry counts as
published only once enough replicas have it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from dispatcher.redis_client import RedisClient
from dispatcher.stream.entries import Fields, PublishResult

__all__ = ["InsufficientReplicas", "RedisStreamPublisher", "ensure_group", "error_code"]


class InsufficientReplicas(RedisError):
    """``WAIT`` returned fewer replica acknowledgements than required."""


def error_code(exc: BaseException) -> str:
    """The Redis error code of a reply error: its first word (``BUSYGROUP``, ``NOGROUP``...)."""
    return str(exc).split(" ", 1)[0] if isinstance(exc, ResponseError) else ""


async def ensure_group(client: RedisClient, stream: str, group: str) -> bool:
    """Create ``group`` on ``stream`` at id 0 (creating the stream too).

    Returns True if it was created, False if it already existed. Starting at
    0, not ``$``, means entries published before any worker started are read.
    A Redis at ``maxmemory`` refuses the command even when the group exists;
    then the group is looked up instead, so a full Redis does not stop the
    workers that would drain it.
    """
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if error_code(exc) == "BUSYGROUP":
            return False
        if isinstance(exc, OutOfMemoryError) and await _group_exists(client, stream, group):
            return False
        raise
    return True


async def _group_exists(client: RedisClient, stream: str, group: str) -> bool:
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no such stream
        return False
    return any(g.get("name") == group for g in groups)


class RedisStreamPublisher:
    """Publishes entries to Redis Streams, standalone or Cluster; safe for concurrent use.

    ``group``: if set, the consumer group is created on each stream before the
    first entry is published to it (once per stream per publisher), so no
    entry is ever skipped by a group created later at ``$``.
    """

    def __init__(self, client: RedisClient, *, group: str | None = None) -> None:
        self._client = client
        self._group = group
        self._ready: set[str] = set()

    @property
    def client(self) -> RedisClient:
        return self._client

    async def publish(self, stream: str, fields: Fields) -> str:
        (result,) = await self.publish_many([(stream, fields)])
        if result.error is not None:
            raise result.error
        assert result.entry_id is not None
        return result.entry_id

    async def publish_many(
        self,
        entries: Sequence[tuple[str, Fields]],
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> list[PublishResult]:
        group_errors = await self._ensure_groups(stream for stream, _ in entries)
        todo = [(s, f) for s, f in entries if s not in group_errors]
        published = iter(await self._xadd_all(todo, wait_replicas, wait_timeout_ms))
        return [
            PublishResult(stream=s, error=group_errors[s]) if s in group_errors else next(published)
            for s, _ in entries
        ]

    async def _xadd_all(
        self, entries: Sequence[tuple[str, Fields]], wait_replicas: int, wait_timeout_ms: int
    ) -> list[PublishResult]:
        if not entries:
            return []
        pipe = self._client.pipeline(transaction=False)
        for stream, fields in entries:
            # XADD stream * field value ...: the command itself, without redis-py's xadd()
            # option handling (a measurable share of the enqueuer's CPU per row).
            pipe.execute_command(
                "XADD", stream, "*", *itertools.chain.from_iterable(fields.items())
            )
        try:
            if wait_replicas > 0 and isinstance(self._client, RedisCluster):
                await self._client.initialize()  # the slot map names WAIT's nodes
        except (RedisError, OSError) as exc:
            return [PublishResult(stream=s, error=exc) for s, _ in entries]
        wait_nodes = self._queue_waits(pipe, entries, wait_replicas, wait_timeout_ms)
        try:
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            return [PublishResult(stream=s, error=exc) for s, _ in entries]
        acks = dict(zip(wait_nodes, replies[len(entries) :], strict=True))
        return [
            self._result(stream, reply, acks.get(self._node_of(stream)), wait_replicas)
            for (stream, _), reply in zip(entries, replies, strict=False)
        ]

    def _queue_waits(
        self, pipe: Any, entries: Sequence[tuple[str, Fields]], replicas: int, timeout_ms: int
    ) -> list[str]:
        """Append one WAIT per node written to; return the nodes in queue order."""
        if replicas <= 0:
            return []
        if not isinstance(self._client, RedisCluster):
            pipe.execute_command("WAIT", replicas, timeout_ms)
            return [""]
        nodes: list[str] = []
        for stream, _ in entries:
            node = self._client.get_node_from_key(stream)
            if node is not None and node.name not in nodes:
                nodes.append(node.name)
                pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
        return nodes

    def _node_of(self, stream: str) -> str:
        if isinstance(self._client, RedisCluster):
            node = self._client.get_node_from_key(stream)
            return node.name if node is not None else "?"
        return ""

    @staticmethod
    def _result(stream: str, reply: Any, acked: Any, wanted: int) -> PublishResult:
        if isinstance(reply, BaseException):
            return PublishResult(stream=stream, error=reply)
        if wanted > 0:
            if isinstance(acked, BaseException):
                return PublishResult(stream=stream, entry_id=None, error=acked)
            if not isinstance(acked, int) or acked < wanted:
                return PublishResult(
                    stream=stream,
                    error=InsufficientReplicas(
                        f"entry {reply} on {stream} reached {acked} of {wanted} replicas"
                    ),
                )
        return PublishResult(stream=stream, entry_id=str(reply))

    async def _ensure_groups(self, streams: Iterable[str]) -> dict[str, BaseException]:
        """Create the group on streams not seen yet; return the streams that failed."""
        failed: dict[str, BaseException] = {}
        if self._group is None:
            return failed
        for stream in dict.fromkeys(streams):
            if stream in self._ready:
                continue
            try:
                await ensure_group(self._client, stream, self._group)
            except (RedisError, OSError) as exc:
                failed[stream] = exc
            else:
                self._ready.add(stream)
        return failed
