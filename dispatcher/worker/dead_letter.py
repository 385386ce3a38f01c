"""Dead letters: entries a worker gives up on, parked in ``workflow.dead.<queue>``.

An entry is dead-lettered when it cannot be parsed (malformed) or was
delivered more than ``max_deliveries`` times. The dead letter carries the
original fields plus ``error``, ``delivery_count``, ``source_stream`` and
``source_id`` (the contract in ARCHITECTURE.md). The worker writes it first
and acks the source entry after, so a crash in between duplicates a dead
letter and never loses one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import dead_letter_stream
from dispatcher.stream.protocol import Message

__all__ = [
    "DEAD_LETTER_FIELDS",
    "ErrorMemory",
    "dead_letter_fields",
    "describe_error",
    "original_fields",
    "write_dead_letter",
]

MAX_ERROR_CHARS = 2000
# What a dead letter adds to the original fields (the contract in ARCHITECTURE.md).
DEAD_LETTER_FIELDS = ("error", "delivery_count", "source_stream", "source_id")


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to a size a stream field can carry."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def dead_letter_fields(message: Message, *, error: str) -> dict[str, str]:
    """The dead letter of ``message``: its fields plus why and where it came from."""
    return {
        **message.fields,
        "error": error,
        "delivery_count": str(message.delivery_count),
        "source_stream": message.stream,
        "source_id": message.id,
    }


def original_fields(dead_letter: Mapping[str, str]) -> dict[str, str]:
    """A dead letter's fields without what dead-lettering added: the entry to replay."""
    return {k: v for k, v in dead_letter.items() if k not in DEAD_LETTER_FIELDS}


async def write_dead_letter(
    client: RedisClient, *, queue: str, message: Message, error: str
) -> str:
    """Append the dead letter of ``message`` to its queue's dead stream; return its id."""
    fields = dead_letter_fields(message, error=error)
    return str(await client.xadd(dead_letter_stream(queue), dict[Any, Any](fields)))


class ErrorMemory:
    """The last handler error per stream entry, bounded (oldest forgotten first).

    Lets this worker's dead letter say what actually failed when it reclaims
    its own failed entry; entries failed elsewhere get a generic reason.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._errors: OrderedDict[tuple[str, str], str] = OrderedDict()

    def remember(self, message: Message, error: str) -> None:
        key = (message.stream, message.id)
        self._errors[key] = error
        self._errors.move_to_end(key)
        while len(self._errors) > self._capacity:
            self._errors.popitem(last=False)

    def recall(self, message: Message) -> str | None:
        return self._errors.get((message.stream, message.id))

    def forget(self, message: Message) -> None:
        if self._errors:  # nearly always empty: every entry settled forgets
            self._errors.pop((message.stream, message.id), None)

    def __len__(self) -> int:
        return len(self._errors)
