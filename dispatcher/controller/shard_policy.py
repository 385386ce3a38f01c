"""The operator's shard policy: what to do with the count in ``composer:stream_shards``, pure.

The key follows ``spec.shards`` at once, up or down. Enqueuers route each row
when they publish it, by the count they read live, so after a decrease nothing
new goes to the removed shards (rows waiting for a retry or ``not_before``
included); workers keep reading every shard stream that still holds entries or
pending entries until it is empty. ``decide_shards`` is the rule; the operator
measures the key and the streams in its Redis round trip
(``dispatcher.controller.redis_access``), writes the key when told, and reports the
removed shards that still hold work (``draining_shards``) as ``ShardsDraining``.
Reading and writing the key itself is ``dispatcher.stream.shard_count``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.stream.naming import SHARDS_KEY, parse_task_stream

__all__ = ["ShardDecision", "decide_shards", "draining_shards"]


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


def decide_shards(
    *, desired: int, published: int | None, draining: Mapping[str, tuple[int, int]] = {}
) -> ShardDecision:
    """Write the key unless it already says ``desired``; never wait for a drain."""
    action: Literal["set", "keep"] = "keep" if published == desired else "set"
    return ShardDecision(action=action, shards=desired, draining=dict(draining))


def draining_shards(
    streams: Mapping[str, tuple[int, int]], *, queues: Sequence[str], shards: int
) -> dict[str, tuple[int, int]]:
    """The measured streams of ``queues`` at shard >= ``shards`` with entries or pending."""
    found = {}
    for stream, (length, pending) in streams.items():
        queue, shard = parse_task_stream(stream)
        if queue in queues and shard >= shards and (length or pending):
            found[stream] = (length, pending)
    return found
