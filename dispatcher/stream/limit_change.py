"""A change of a queue's limits, as ``dispatcher limits set`` and the console both make it.

``requested_limits`` is pure: the fields given laid over the current limits
(all replaced when ``clear``), where 0 removes a limit. ``change_limits`` reads
the current key, decides and writes, in that order; every worker of the queue
applies the result within ``REFRESH_EVERY`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher.redis_client import RedisClient
from dispatcher.stream.limit_keys import InvalidLimits, QueueLimits, read_limits, write_limits

__all__ = ["LimitChange", "StoredLimitsInvalid", "change_limits", "requested_limits"]


class StoredLimitsInvalid(InvalidLimits):
    """The queue's key holds no valid limits: only a change that clears them may replace it."""


@dataclass(frozen=True, slots=True)
class LimitChange:
    """What a change found and what it wrote (None: the queue had no valid limits)."""

    queue: str
    was: QueueLimits | None
    now: QueueLimits


def requested_limits(
    current: QueueLimits | None, *, given: dict[str, Any], clear: bool
) -> QueueLimits:
    """The limits to write; ``InvalidLimits`` (one line) when ``given`` says nothing or is bad."""
    if not given and not clear:
        raise InvalidLimits("nothing to set: give max-in-flight, rate/burst or clear")
    fields = {} if clear or current is None else current.model_dump(exclude_none=True)
    fields.update(given)
    if fields.get("rate") == 0:
        fields.pop("rate")
        if "burst" not in given:
            fields.pop("burst", None)
    if fields.get("max_in_flight") == 0:
        fields.pop("max_in_flight")
    try:
        return QueueLimits.model_validate(fields)
    except ValueError as exc:
        raise InvalidLimits(_first_error(exc)) from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in errors())
    return str(exc)


async def change_limits(
    client: RedisClient, queue: str, *, given: dict[str, Any], clear: bool
) -> LimitChange:
    """Write ``given`` over the queue's limits (or in place of them with ``clear``).

    A key that holds no valid limits is refused (``StoredLimitsInvalid``) unless
    ``clear`` replaces it; a bad request is refused (``InvalidLimits``); either
    way nothing is written.
    """
    if clear or not given:  # what is given says it all: refused before any read
        requested_limits(None, given=given, clear=clear)
    try:
        current = await read_limits(client, queue)
    except InvalidLimits as exc:
        if not clear:
            raise StoredLimitsInvalid(str(exc)) from None
        current = None
    wanted = requested_limits(current, given=given, clear=clear)
    await write_limits(client, queue, wanted)
    return LimitChange(queue=queue, was=current, now=wanted)
