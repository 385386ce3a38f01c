"""Dead letters: entries a worker gives up on, parked in ``workflow.dead.<queue>``.

An entry is dead-lettered when it cannot be parsed (malformed) or its
attempt used up ``max_runs`` handler runs. The dead letter carries the
original fields plus ``error``, ``delivery_count``, ``runs`` (handler runs
started; 0 for a malformed entry), ``source_stream`` and ``source_id``. The worker writes it first
and acks the source entry after, so a crash in between duplicates a dead
letter and never loses one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.models import DEAD_LETTER_FIELDS  # what a dead letter adds; payloads may not
from dispatcher.redis_client import RedisClient
from dispatcher.stream.entries import Message
from dispatcher.stream.naming import dead_letter_stream

__all__ = [
    "DEAD_LETTER_FIELDS",
    "dead_letter_fields",
    "describe_error",
    "original_fields",
    "write_dead_letter",
]

MAX_ERROR_CHARS = 2000


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to a size a stream field can carry."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def dead_letter_fields(message: Message, *, error: str, runs: int = 0) -> dict[str, str]:
    """The dead letter of ``message``: its fields plus why and where it came from."""
    return {
        **message.fields,
        "error": error,
        "delivery_count": str(message.delivery_count),
        "runs": str(runs),
        "source_stream": message.stream,
        "source_id": message.id,
    }


def original_fields(dead_letter: Mapping[str, str]) -> dict[str, str]:
    """A dead letter's fields without what dead-lettering added: the entry to replay."""
    return {k: v for k, v in dead_letter.items() if k not in DEAD_LETTER_FIELDS}


async def write_dead_letter(
    client: RedisClient, *, queue: str, message: Message, error: str, runs: int = 0
) -> str:
    """Append the dead letter of ``message`` to its queue's dead stream; return its id."""
    fields: dict[Any, Any] = dead_letter_fields(message, error=error, runs=runs)
    if message.error is not None:  # not UTF-8: write its original bytes back, not the escapes
        fields = {_bytes(k): _bytes(v) for k, v in fields.items()}
    return str(await client.xadd(dead_letter_stream(queue), fields))


def _bytes(text: str) -> bytes:
    return text.encode(errors="surrogateescape")
