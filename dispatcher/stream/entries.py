"""Stream entries as values: the fields of an entry, a consumed entry, a publish's outcome.

Field values are strings: a stream entry is a flat map of string fields (an
outbox row's payload keys plus ``outbox_id``). ``RedisStreamPublisher``
returns ``PublishResult``s, ``RedisStreamConsumer`` hands out ``Message``s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Fields", "Message", "PublishResult"]

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
