"""The shard count in Redis (``composer:stream_shards``): a pure decision and its effect.

The key follows ``spec.shards`` at once, up or down. Enqueuers route each row
when they publish it, by the count they read live, so after a decrease nothing
new goes to the removed shards (rows waiting for a retry or ``not_before``
included); workers keep reading every shard stream that still holds entries
or pending entries until it is empty. ``decide_shards`` is the rule;
``reconcile_shards`` reads the key, writes it if needed and lists the removed
shards that are still draining (for the ``ShardsDraining`` condition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.redis_client import RedisClient
from dispatcher.stream.discovery import queue_shards
from dispatcher.stream.naming import SHARDS_KEY
from dispatcher.stream.shards import parse_shard_count, publish_shard_count

__all__ = ["ShardDecision", "decide_shards", "read_published", "reconcile_shards"]


@dataclass(frozen=True, slots=True)
class ShardDecision:
    action: Literal["set", "keep"]
    shards: int  # the count in effect after the decision
    draining: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (length, pending)

    @property
    def message(self) -> str:
        return f"{SHARDS_KEY} = {self.shards}"

    @property
    def draining_message(self) -> str:
        if not self.draining:
            return ""
        held = ", ".join(
            f"{s} (length {n}, pending {p})" for s, (n, p) in sorted(self.draining.items())
        )
        return f"removed shards still hold work, workers read them until empty: {held}"


def decide_shards(*, desired: int, published: int | None) -> Literal["set", "keep"]:
    """Write the key unless it already says ``desired``."""
    return "keep" if published == desired else "set"


async def read_published(client: RedisClient) -> int | None:
    raw = await client.get(SHARDS_KEY)
    return None if raw is None else parse_shard_count(raw)


async def reconcile_shards(
    client: RedisClient, *, desired: int, queues: Sequence[str], group: str
) -> ShardDecision:
    """Bring the key to ``desired``; report the shards beyond it that are not empty yet."""
    action = decide_shards(desired=desired, published=await read_published(client))
    if action == "set":
        await publish_shard_count(client, desired)
    draining = {
        state.stats.stream: (state.stats.length, state.stats.pending)
        for queue in queues
        for state in await queue_shards(client, queue, shards=desired, group=group)
        if state.draining
    }
    return ShardDecision(action=action, shards=desired, draining=draining)
