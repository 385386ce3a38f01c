"""A read batch's entries as tasks: parsed together, each bad one its own error."""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.models import MalformedMessage, TaskMessage, parse_tasks
from dispatcher.stream.entries import Message
from dispatcher.worker.dead_letter import describe_error

__all__ = ["aligned", "tasks_of"]


def tasks_of(messages: Sequence[Message]) -> list[TaskMessage | MalformedMessage]:
    """The batch's tasks; an unreadable or unparseable entry is its own ``MalformedMessage``."""
    try:
        tasks = parse_tasks([message.fields for message in messages])
    except Exception:  # whatever the batch parse raised: find the culprits one by one
        tasks = [_parsed_alone(message) for message in messages]
    for index, message in enumerate(messages):
        if message.error is not None:
            tasks[index] = MalformedMessage(f"cannot read it: {message.error}")
    return tasks


def _parsed_alone(message: Message) -> TaskMessage | MalformedMessage:
    try:
        return TaskMessage.from_fields(message.fields)
    except MalformedMessage as exc:
        return exc
    except Exception as exc:
        return MalformedMessage(f"cannot parse it: {describe_error(exc)}")


def aligned(keys: list[str | None], claims: list[int]) -> list[int | None]:
    """The claim of each entry (None for a malformed one, which was not claimed)."""
    found = iter(claims)
    return [next(found) if key is not None else None for key in keys]
