"""The shard count in Redis (``composer:stream_shards``): the pure decision of what to do with it.

Raising the count is safe at once: workers start reading new shards as soon
as they see the key. Lowering it is refused while any shard being removed
still holds entries, since nobody would read them again. ``decide_shards``
is the rule; the operator measures the key and the stream lengths in its one
Redis round trip (``controller.redis_access``) and writes the key when told.
Writers that cached the old count can still add to a removed shard right
after the switch; workers keep reading every shard they started on until they
restart, which covers that window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.stream.naming import SHARDS_KEY, task_stream

__all__ = ["ShardDecision", "decide_shards", "streams_to_drain"]


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
