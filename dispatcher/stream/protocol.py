"""The transport-independent stream contract: messages, publishers, consumers.

The enqueuer and the worker runtime depend on these protocols only; the Redis
Streams implementation lives beside them. Field values are strings: the wire
format of a stream entry is a flat string map (see ``ARCHITECTURE.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Consumer", "Fields", "Message", "PublishResult", "Publisher"]

Fields = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Message:
    """One stream entry as a consumer sees it.

    ``delivery_count`` is 1 on a first delivery and grows with every
    redelivery; it is exact for reclaimed messages (read back from the PEL).
    ``error`` says why the entry cannot be read (its bytes are not UTF-8:
    ``fields`` then hold them as surrogate escapes); None for a readable one.
    """

    stream: str
    id: str
    fields: Fields
    delivery_count: int = 1
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The outcome of one entry of a batch publish: an entry id or an error."""

    stream: str
    entry_id: str | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.entry_id is not None


@runtime_checkable
class Publisher(Protocol):
    """Appends entries to named streams. Safe for concurrent use."""

    async def publish(self, stream: str, fields: Fields) -> str:
        """Append one entry; return its id, raise if it was not stored."""
        ...

    async def publish_many(self, entries: Sequence[tuple[str, Fields]]) -> list[PublishResult]:
        """Append many entries in as few round trips as the transport allows.

        Returns one result per entry, in order; one failed entry never fails
        or hides the others.
        """
        ...


@runtime_checkable
class Consumer(Protocol):
    """Reads one stream with consumer-group semantics (at-least-once)."""

    stream: str

    async def setup(self) -> None:
        """Create the consumer group (and the stream); an existing group is fine."""
        ...

    async def read_new(self, max_count: int) -> list[Message]:
        """Block for up to the configured time; return never-delivered messages."""
        ...

    async def reclaim_orphaned(self, min_idle_ms: int) -> list[Message]:
        """Take over messages idle in other consumers' PEL for at least ``min_idle_ms``."""
        ...

    async def ack(self, message_id: str) -> None:
        """Acknowledge and delete a message; raise if Redis did not take it."""
        ...

    async def close(self) -> None:
        """Release this consumer's resources (not the shared client)."""
        ...
