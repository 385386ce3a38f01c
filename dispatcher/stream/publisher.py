"""Publish entries to Redis Streams: one write per batch (per node), replies read in bulk.

``publish_packed`` takes XADD commands already packed as RESP (``xadd_command``)
and writes them all at once; on Redis Cluster each node gets its
share in one write, concurrently, by the slot of each entry's stream. Results
are per entry: a failed XADD (wrong type, OOM, a node down) is reported for
that entry alone. With ``wait_replicas`` a ``WAIT`` rides in the same write,
on the same connection, after the writes of each node, so an entry counts as
published only once enough replicas have it. ``publish_many`` is the same for
entries given as (stream, fields).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis  # a dependency: redis[hiredis]
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import (
    OutOfMemoryError,
    RedisError,
    ResponseError,
)

from dispatcher.redis_client import RedisClient
from dispatcher.redis_connection import execute_packed, pack_commands
from dispatcher.stream.entries import Fields, PublishResult

__all__ = [
    "InsufficientReplicas",
    "RedisStreamPublisher",
    "ensure_group",
    "error_code",
    "xadd_args_command",
    "xadd_command",
]

Wait = tuple[int, int]  # (replicas, timeout in ms); 0 replicas: no WAIT


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
    """``Publisher`` on Redis Streams, standalone or Cluster.

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

    @property
    def group(self) -> str | None:
        """The consumer group made on each stream before its first entry (None: none)."""
        return self._group

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
        """Publish a small batch of (stream, fields) entries; one result per entry, in order."""
        streams = [stream for stream, _ in entries]
        commands = [xadd_command(stream, fields) for stream, fields in entries]
        replies = await self.publish_packed(
            streams, commands, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms
        )
        return [
            PublishResult(stream=s, error=r)
            if isinstance(r, BaseException)
            else PublishResult(stream=s, entry_id=str(r))
            for s, r in zip(streams, replies, strict=True)
        ]

    async def publish_packed(
        self,
        streams: Sequence[str],
        commands: Sequence[bytes],
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> list[Any]:
        """Write XADD ``commands`` (RESP, one per entry, to ``streams``) in one go.

        One reply per entry, in order: its entry id, or the exception it failed with.
        """
        replies: list[Any] = [None] * len(commands)
        failed = await self._ensure_groups(streams)
        todo: Sequence[int] = range(len(commands))
        if failed:
            todo = [i for i, stream in enumerate(streams) if stream not in failed]
            for i, stream in enumerate(streams):
                if stream in failed:
                    replies[i] = failed[stream]
        if not todo:
            return replies
        wait = (wait_replicas, wait_timeout_ms)
        if isinstance(self._client, RedisCluster):
            await _Cluster(self._client, streams, commands, wait).send(todo, replies)
        else:
            await _send_standalone(self._client, commands, todo, wait, replies)
        return replies

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


def xadd_command(stream: str, fields: Fields) -> bytes:
    """``XADD stream * field value ...`` packed as RESP."""
    return xadd_args_command(stream, itertools.chain.from_iterable(fields.items()))


def xadd_args_command(stream: str, args: Iterable[str]) -> bytes:
    """``XADD stream * <args>`` packed as RESP; ``args``: field, value, field, value..."""
    # hiredis's stub declares a 1-tuple where it takes any number of arguments
    packed: bytes = hiredis.pack_command(("XADD", stream, "*", *args))  # type: ignore[arg-type]
    return packed


def _wait_command(wait: Wait) -> bytes:
    return pack_commands([("WAIT", wait[0], wait[1])])


def _acked(replies: list[Any], wait: Wait) -> BaseException | None:
    """The error every entry of a write gets from its WAIT reply (None: enough replicas)."""
    if wait[0] <= 0:
        return None
    acked = replies.pop()
    if isinstance(acked, BaseException):
        return acked
    if not isinstance(acked, int) or acked < wait[0]:
        return InsufficientReplicas(f"entries reached {acked} of {wait[0]} replicas")
    return None


async def _send_standalone(
    client: Redis, commands: Sequence[bytes], todo: Sequence[int], wait: Wait, replies: list[Any]
) -> None:
    if len(todo) == len(commands):
        packed = b"".join(commands)
    else:
        packed = b"".join([commands[i] for i in todo])
    if wait[0] > 0:
        packed += _wait_command(wait)
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            got = await execute_packed(conn, packed, len(todo) + (wait[0] > 0))
        finally:
            await pool.release(conn)
    except (RedisError, OSError) as exc:
        for i in todo:
            replies[i] = exc
        return
    _place(got, _acked(got, wait), todo, replies)


def _place(
    got: list[Any], error: BaseException | None, todo: Sequence[int], out: list[Any]
) -> None:
    if error is not None:
        for i, reply in zip(todo, got, strict=True):
            out[i] = reply if isinstance(reply, BaseException) else error
    elif len(todo) == len(out):
        out[:] = got
    else:
        for i, reply in zip(todo, got, strict=True):
            out[i] = reply


class _Cluster:
    """One batch's writes to a Cluster, through redis-py's cluster pipeline.

    It groups the commands by the node owning each stream's slot and sends each
    node its share in one round trip, concurrently, and it follows the slot map
    through failovers and reshardings (MOVED, ASK, a node gone). The commands
    come packed; they are unpacked for it (in C), and WAITs are queued per node.
    """

    def __init__(
        self, client: RedisCluster, streams: Sequence[str], commands: Sequence[bytes], wait: Wait
    ) -> None:
        self._client = client
        self._streams = streams
        self._commands = commands
        self._wait = wait

    async def send(self, todo: Sequence[int], replies: list[Any]) -> None:
        pipe = self._client.pipeline(transaction=False)
        reader = hiredis.Reader(encoding="utf-8")
        for i in todo:
            reader.feed(self._commands[i])
            pipe.execute_command(*reader.gets())
        try:
            if self._wait[0] > 0:
                await self._client.initialize()  # the slot map names WAIT's nodes
            nodes = self._queue_waits(pipe, todo)
            got: list[Any] = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            for i in todo:
                replies[i] = exc
            return
        acks = dict(zip(nodes, got[len(todo) :], strict=True))
        for i, reply in zip(todo, got, strict=False):
            error = None
            if self._wait[0] > 0 and not isinstance(reply, BaseException):
                error = _acked([acks.get(self._node_of(self._streams[i]))], self._wait)
            replies[i] = error or reply

    def _queue_waits(self, pipe: Any, todo: Sequence[int]) -> list[str]:
        """Append one WAIT per node written to; return the nodes in queue order."""
        if self._wait[0] <= 0:
            return []
        nodes: list[str] = []
        for i in todo:
            node = self._client.get_node_from_key(self._streams[i])
            if node is not None and node.name not in nodes:
                nodes.append(node.name)
                pipe.execute_command("WAIT", *self._wait, target_nodes=node)
        return nodes

    def _node_of(self, stream: str) -> str:
        node = self._client.get_node_from_key(stream)
        return node.name if node is not None else "?"
