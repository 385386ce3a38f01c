"""The shard count in Redis (``composer:stream_shards``): a pure decision and its effect.

Raising the count is safe at once: workers start reading new shards as soon
as they see the key. Lowering it is refused while any shard being removed
still holds entries, since nobody would read them again. ``decide_shards``
is the rule; ``reconcile_shards`` reads the key and the stream lengths,
decides, and writes the key. Writers that cached the old count can still
add to a removed shard right after the switch; workers keep reading every
shard they started on until they restart, which covers that window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import SHARDS_KEY, task_stream
from dispatcher.stream.shards import parse_shard_count, publish_shard_count

__all__ = ["ShardDecision", "decide_shards", "reconcile_shards", "streams_to_drain"]


@dataclass(frozen=True, slots=True)
class ShardDecision:
    action: Literal["set", "keep", "block"]
    shards: int  # the count in effect after the decision
    blocking: Mapping[str, int] = field(default_factory=dict)  # stream -> entries left

    @property
    def message(self) -> str:
        if self.action != "block":
            return f"{SHARDS_KEY} = {self.shards}"
        held = ", ".join(f"{s} ({n})" for s, n in sorted(self.blocking.items()))
        return (
            f"cannot lower the shard count below {self.shards} yet: "
            f"the removed shards still hold entries: {held}"
        )


def streams_to_drain(queues: Sequence[str], *, published: int, desired: int) -> list[str]:
    """The streams a decrease from ``published`` to ``desired`` would abandon."""
    return [task_stream(q, s) for q in queues for s in range(desired, published)]


def decide_shards(
    *, desired: int, published: int | None, lengths: Mapping[str, int]
) -> ShardDecision:
    """What to do with the key, given the lengths of ``streams_to_drain``."""
    if published == desired:
        return ShardDecision(action="keep", shards=desired)
    if published is None or desired > published:
        return ShardDecision(action="set", shards=desired)
    blocking = {stream: n for stream, n in lengths.items() if n > 0}
    if blocking:
        return ShardDecision(action="block", shards=published, blocking=blocking)
    return ShardDecision(action="set", shards=desired)


async def read_published(client: RedisClient) -> int | None:
    raw = await client.get(SHARDS_KEY)
    return None if raw is None else parse_shard_count(raw)


async def reconcile_shards(
    client: RedisClient, *, desired: int, queues: Sequence[str]
) -> ShardDecision:
    """Bring the key to ``desired`` if that strands nothing; report what happened."""
    published = await read_published(client)
    lengths: dict[str, int] = {}
    if published is not None and desired < published:
        for stream in streams_to_drain(queues, published=published, desired=desired):
            lengths[stream] = int(await client.xlen(stream))
    decision = decide_shards(desired=desired, published=published, lengths=lengths)
    if decision.action == "set":
        await publish_shard_count(client, decision.shards)
    return decision
