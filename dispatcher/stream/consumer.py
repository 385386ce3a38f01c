"""Read one Redis stream through a consumer group: at-least-once delivery.

``read_new`` hands each new entry to exactly one consumer of the group; an
entry stays in the group's pending entries list (PEL) until ``ack``.
``reclaim_orphaned`` takes over entries left idle (their consumer crashed or
hung, or their handler failed) and reports exact delivery counts;
``keep_fresh`` keeps entries whose handler still runs from looking idle.
One consumer object reads one stream, so on Redis Cluster every read is
single-key and never CROSSSLOT. ``ack_many`` settles many entries of the
stream in one round trip; ``add_ack`` queues the same commands on a caller's
pipeline, so they can travel with other writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline
from redis.client import NEVER_DECODE

from dispatcher.redis_client import RedisClient
from dispatcher.stream.entries import Message
from dispatcher.stream.publisher import ensure_group

__all__ = ["RedisPipeline", "RedisStreamConsumer"]

RedisPipeline = Pipeline | ClusterPipeline

_RAW = {NEVER_DECODE: True}
_utf8 = bytes.decode  # strict UTF-8


def _escaped(value: bytes) -> str:
    return value.decode(errors="surrogateescape")


@dataclass
class RedisStreamConsumer:
    """A consumer (one name in one group) of one stream on Redis (standalone or Cluster).

    ``reclaim_batch`` is the XAUTOCLAIM COUNT of one call; ``reclaim_limit``
    bounds how many entries one ``reclaim_orphaned`` call takes while it
    follows the XAUTOCLAIM cursor.
    """

    client: RedisClient
    stream: str
    group: str
    consumer: str
    block_ms: int = 2000
    reclaim_batch: int = 100
    reclaim_limit: int = 1000
    # The id of the newest entry ``read_new`` handed out ("0": none yet).
    _last_read: str = field(default="0", init=False, repr=False)
    # The client decodes replies to ``str`` (then reads decode in its parser).
    _decodes: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._decodes = bool(self.client.get_encoder().decode_responses)

    async def setup(self) -> None:
        await ensure_group(self.client, self.stream, self.group)

    async def read_new(self, max_count: int, *, block: bool = True) -> list[Message]:
        """Never-delivered entries; ``block=False`` answers at once, maybe with none.

        A client that decodes replies (``connect_redis``'s) decodes the entries as
        it parses them, in C. One entry that is not UTF-8 fails that whole reply,
        though the read already handed its entries to us: they are then read
        again from our own pending entries as bytes, and only that entry is
        marked unreadable (an ``error``), as with a client that does not decode.
        """
        args: list[bytes | str | int] = [b"GROUP", self.group, self.consumer]
        args += [b"COUNT", max(max_count, 1)]
        if block:
            args += [b"BLOCK", self.block_ms]
        args += [b"STREAMS", self.stream]
        if not self._decodes:
            return self._messages(await self._read(args, b">", **_RAW))
        try:
            reply = await self._read(args, b">")
        except UnicodeDecodeError:
            return await self._read_again(max_count)
        stream = self.stream
        messages = [
            Message(stream, eid, fields) for _s, entries in reply or () for eid, fields in entries
        ]
        if messages:
            self._last_read = messages[-1].id
        return messages

    async def _read(self, args: list[bytes | str | int], after: bytes | str, **raw: bool) -> Any:
        return await self.client.execute_command("XREADGROUP", *args, after, **raw)

    async def _read_again(self, max_count: int) -> list[Message]:
        """Our pending entries after the last read, as bytes: a read whose reply failed.

        Entries we read before and still hold are not among them (their ids are
        lower); any of ours that are (reclaimed ones, say) are already in hand
        and are skipped by whoever handles the batch.
        """
        args: list[bytes | str | int] = [b"GROUP", self.group, self.consumer]
        args += [b"COUNT", max(max_count, 1), b"STREAMS", self.stream]
        messages = self._messages(await self._read(args, self._last_read, **_RAW))
        if messages:
            self._last_read = messages[-1].id
        return messages

    def _messages(self, reply: Any) -> list[Message]:
        return [
            self._message(eid, fields) for _s, entries in reply or () for eid, fields in entries
        ]

    async def reclaim_orphaned(self, min_idle_ms: int) -> list[Message]:
        claimed: list[tuple[bytes, dict[bytes, bytes]]] = []
        cursor: bytes | str = b"0-0"
        while len(claimed) < self.reclaim_limit:
            count = min(self.reclaim_batch, self.reclaim_limit - len(claimed))
            reply = await self.client.execute_command(
                "XAUTOCLAIM",
                *(self.stream, self.group, self.consumer, min_idle_ms, cursor, b"COUNT", count),
                **_RAW,
            )
            # Redis >= 7 answers [cursor, entries, deleted ids]; the deleted ids
            # were already dropped from the PEL by Redis itself. Redis 6.2 answers
            # [cursor, entries] with a nil body for a deleted entry.
            cursor, entries = reply[0], reply[1]
            stale = [eid for eid, fields in entries if fields is None]
            claimed.extend((eid, fields) for eid, fields in entries if fields is not None)
            if stale:
                await self._drop([eid.decode() for eid in stale])
            if cursor == b"0-0":
                break
        if not claimed:
            return []
        messages = [self._message(eid, fields) for eid, fields in claimed]
        counts = await self._delivery_counts([m.id for m in messages])
        return [replace(m, delivery_count=counts.get(m.id, 1)) for m in messages]

    def _message(self, entry_id: bytes, fields: dict[bytes, bytes] | None) -> Message:
        raw = fields or {}
        try:
            decoded = dict(zip(map(_utf8, raw.keys()), map(_utf8, raw.values()), strict=True))
        except UnicodeDecodeError as exc:
            # Kept as surrogate escapes: a dead letter written from them has the same bytes.
            escaped = {_escaped(k): _escaped(v) for k, v in raw.items()}
            return Message(self.stream, entry_id.decode(), escaped, error=f"not UTF-8: {exc}")
        return Message(self.stream, entry_id.decode(), decoded)

    async def keep_fresh(self, entry_ids: Sequence[str]) -> None:
        """Reset the idle time of our pending ``entry_ids``: nobody reclaims them for a while.

        ``XCLAIM <group> <self> 0 <ids> JUSTID`` neither raises their delivery
        counts nor returns their bodies; ids no longer pending are skipped.
        """
        await self.client.xclaim(
            self.stream, self.group, self.consumer, 0, list(entry_ids), justid=True
        )

    async def ack(self, message_id: str) -> None:
        await self.ack_many([message_id])

    async def ack_many(self, message_ids: Sequence[str]) -> None:
        """XACK + XDEL of all ``message_ids`` in one round trip; raise if Redis refused."""
        if not message_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        self.add_ack(pipe, message_ids)
        await pipe.execute()

    def add_ack(self, pipe: RedisPipeline, message_ids: Sequence[str]) -> None:
        """Queue XACK then XDEL of ``message_ids`` on ``pipe``; the caller executes it."""
        pipe.xack(self.stream, self.group, *message_ids)
        pipe.xdel(self.stream, *message_ids)

    async def pending_count(self) -> int:
        """Entries delivered to this consumer and not yet acked."""
        summary = await self.client.xpending(self.stream, self.group)
        consumers = summary.get("consumers") or []
        return sum(int(c["pending"]) for c in consumers if c["name"] == self.consumer)

    async def close(self) -> None:
        """Nothing to release: the client is shared and owned by the caller."""

    async def _drop(self, entry_ids: list[str]) -> None:
        """Ack entries whose body is gone, so they leave the PEL for good."""
        await self.client.xack(self.stream, self.group, *entry_ids)

    async def _delivery_counts(self, entry_ids: list[str]) -> dict[str, int]:
        """Delivery counts of our own pending entries in the claimed id range.

        XAUTOCLAIM has already incremented them. One XPENDING call covers the
        range in the common case; we page on only if our PEL holds more.
        """
        wanted = set(entry_ids)
        counts: dict[str, int] = {}
        low, high = min(entry_ids, key=_id_key), max(entry_ids, key=_id_key)
        page = max(len(entry_ids) * 2, 64)
        while wanted - counts.keys():
            rows: list[dict[str, Any]] = await self.client.xpending_range(
                self.stream, self.group, low, high, page, consumername=self.consumer
            )
            for row in rows:
                if row["message_id"] in wanted:
                    counts[row["message_id"]] = int(row["times_delivered"])
            if len(rows) < page:
                break
            low = "(" + str(rows[-1]["message_id"])
        return counts


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
