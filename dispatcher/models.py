"""The task message, on both ends of the pipe, and the wire format between them.

``TaskDispatch`` is what an application enqueues; its JSON payload is stored
in the outbox row. The enqueuer turns a payload into stream fields
(``payload_fields``: the payload's top-level keys, scalars written as the
spec's Go publisher writes them with go-redis v9, objects and arrays as
compact JSON, plus ``outbox_id``); a worker parses those fields back into a
``TaskMessage``. docs/wire-format.md is the table. Pure code, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import from_json

from dispatcher.stream.naming import validate_queue

__all__ = [
    "ADDED_FIELDS",
    "DEAD_LETTER_FIELDS",
    "MalformedMessage",
    "ReservedField",
    "TaskDispatch",
    "TaskMessage",
    "dedup_run_part",
    "parse_tasks",
    "payload_args",
    "payload_fields",
]


_SURROGATE = re.compile("[\ud800-\udfff]")


# What the pipe adds to a task's own fields: the enqueuer ``outbox_id`` to each entry,
# ``enqueue_dispatch`` the trace context to the payload, a worker these to a dead letter (and
# replay strips them again). A payload of its own may use none of them.
DEAD_LETTER_FIELDS = ("error", "delivery_count", "runs", "source_stream", "source_id")
ADDED_FIELDS = frozenset({"outbox_id", "traceparent", "tracestate", *DEAD_LETTER_FIELDS})


class ReservedField(ValueError):
    """A payload key that the pipe adds itself: refused, never overwritten."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"payload key {key!r} is reserved: the dispatcher adds that field itself and would "
            f"overwrite it (reserved: {', '.join(sorted(ADDED_FIELDS))}); rename the key"
        )
        self.key = key


_STRING_FIELDS = ("task_id", "run_id", "workflow_id", "node_id", "node_type", "queue", "input")


class TaskDispatch(BaseModel):
    """One task attempt to dispatch: self-contained, a worker never reads the database.

    ``input`` is the task's resolved input as JSON text (any JSON value); it
    travels as one string field, as written, and the worker decodes it. No
    string field may hold a NUL character or a lone surrogate (the error names the field):
    PostgreSQL would refuse them, aborting the caller's transaction.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str = Field(min_length=1)
    run_id: str
    workflow_id: str
    workflow_version: int
    node_id: str
    node_type: str
    queue: str
    attempt: int = Field(default=1, ge=0)
    input: str = "null"

    # Declared first, so it runs before the queue and input rules and the error says NUL.
    @field_validator(*_STRING_FIELDS)
    @classmethod
    def _no_nul(cls, value: str) -> str:
        # PostgreSQL stores NUL in neither text nor jsonb: refused here, with the caller's
        # transaction untouched, rather than by the server, which aborts the transaction.
        if "\x00" in value:
            raise ValueError("must not contain NUL (\\x00) characters")
        if not value.isascii() and _SURROGATE.search(value):  # not UTF-8: no server takes them
            raise ValueError("must not contain lone surrogates (U+D800 to U+DFFF)")
        return value

    @field_validator("queue")
    @classmethod
    def _queue_is_valid(cls, value: str) -> str:
        return validate_queue(value)

    @field_validator("input")
    @classmethod
    def _input_is_json(cls, value: str) -> str:
        try:
            json.loads(value)
        except ValueError as exc:
            raise ValueError(f"input must be JSON text: {exc}") from None
        return value

    def payload(self, *, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The outbox row's payload: the message without its routing (queue).

        Raises ``ReservedField`` if the message (a subclass) has a field the
        pipe adds itself (``ADDED_FIELDS``).
        """
        body = self.model_dump(exclude={"queue"})
        for key in body.keys() & ADDED_FIELDS:  # a subclass's own field
            raise ReservedField(key)
        if extra:
            body.update(extra)
        return body


def payload_fields(payload: str | None, outbox_id: str) -> dict[str, str]:
    """Stream fields of an outbox payload, per the contract (docs/wire-format.md).

    An object's top-level keys become fields: strings as is; numbers, booleans
    and null as the spec's publisher writes them (``go_scalar``); objects and
    arrays as compact JSON. An empty payload becomes ``{"id": outbox_id}``; a
    payload that is not a JSON object, or that the spec's publisher cannot
    decode (a number beyond float64, NaN), becomes ``{"data": <raw text>}``.
    ``outbox_id`` is always added; a payload with its own raises
    ``ReservedField``.
    """
    flat = iter(payload_args(payload, outbox_id))
    return dict(zip(flat, flat, strict=True))


def payload_args(payload: str | None, outbox_id: str) -> list[str]:
    """``payload_fields`` as XADD takes them: field, value, field, value..., in order.

    The claim path packs these straight into its XADD commands (no dict per row).
    """
    if payload is None or payload.strip() == "":
        return ["id", outbox_id, "outbox_id", outbox_id]
    doc = _json_value(payload)
    if not isinstance(doc, dict):
        return ["data", payload, "outbox_id", outbox_id]
    if "outbox_id" in doc:
        raise ReservedField("outbox_id")
    # JSON object keys are always str, and unique once parsed. Inline on purpose: this runs
    # for every field of every row the enqueuer publishes; a task's strings and small ints
    # (attempt, version) take the first two branches.
    args: list[str] = []
    append = args.append
    try:
        for key, value in doc.items():
            append(key)
            kind = type(value)
            if kind is str:
                append(value)
            elif kind is int and -_EXACT <= value <= _EXACT:
                append(str(value))
            elif kind is dict or kind is list:
                append(_nested_text(value))
            else:
                append(go_scalar(value))
    except _NotDecodable:  # the spec's json.Unmarshal fails, and it publishes the raw text
        return ["data", payload, "outbox_id", outbox_id]
    append("outbox_id")
    append(outbox_id)
    return args


# Integers up to 2**53 are float64 exactly, and go-redis writes them as Python's str() does.
_EXACT = 2**53


class _NotDecodable(ValueError):
    """A value Go's encoding/json refuses into ``interface{}`` (NaN, infinities, > float64)."""


def go_scalar(value: Any) -> str:
    """A JSON scalar as the spec's publisher writes it (docs/wire-format.md).

    The spec's enqueuer decodes the payload with Go's ``encoding/json`` into
    ``map[string]interface{}`` (numbers become float64) and go-redis v9 writes
    each value: a string as is, float64 as ``strconv.FormatFloat(f, 'f', -1,
    64)`` (shortest round-trip digits, never an exponent), bool ``1``/``0``,
    nil as an empty string.
    """
    if value is None:
        return ""
    if value is True:
        return "1"
    if value is False:
        return "0"
    if isinstance(value, str):
        return value
    try:
        number = float(value)
    except OverflowError:
        raise _NotDecodable(value) from None
    if not math.isfinite(number):
        raise _NotDecodable(value)
    return _format_float(number)


def _format_float(number: float) -> str:
    """Go's ``strconv.FormatFloat(number, 'f', -1, 64)``: repr's shortest digits, in full."""
    text = repr(number)  # the shortest digits that read back as the same float, as Go's
    if "e" in text:
        mantissa, _, exp = text.partition("e")
        sign = "-" if mantissa.startswith("-") else ""
        whole, _, frac = mantissa.lstrip("-").partition(".")
        digits, point = whole + frac, len(whole) + int(exp)
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}".rstrip("0").rstrip(".")
        if point >= len(digits):
            return sign + digits + "0" * (point - len(digits))
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return text[:-2] if text.endswith(".0") else text


def _nested_text(value: Any) -> str:
    """An object or array as compact JSON (an extension: the spec's publisher refuses them)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or an infinity inside: Go's decoder refuses the whole payload
        raise _NotDecodable(value) from None


def _json_value(text: str) -> Any:
    """``json.loads(text)``, or None where it raises ValueError; parsed in Rust first.

    pydantic-core's parser (2.4 us for a 0.5 KB dispatch against 4.4: 2026-12-03,
    benchmarks/NOTES.md, "Figures the code's comments quote") gives the same values;
    where it refuses what ``json`` takes (a lone surrogate escape) ``json`` decides.
    """
    try:
        return from_json(text)
    except ValueError:
        try:
            return json.loads(text)
        except ValueError:
            return None


class MalformedMessage(ValueError):
    """A stream entry that cannot be a ``TaskMessage``; the message says why."""


def dedup_run_part(run_id: str) -> str:
    """How ``run_id`` begins a dedup key: ``%`` and ``:`` escaped."""
    if "%" in run_id or ":" in run_id:
        return run_id.replace("%", "%25").replace(":", "%3A")
    return run_id


class TaskMessage(BaseModel):
    """What a worker's handler receives for one delivery."""

    model_config = ConfigDict(frozen=True)

    task_id: str = Field(min_length=1)
    run_id: str
    workflow_id: str
    workflow_version: int
    node_id: str
    node_type: str
    attempt: int
    input: Any
    outbox_id: str = ""
    traceparent: str | None = None

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> TaskMessage:
        """Parse stream fields; raise ``MalformedMessage`` naming what is wrong."""
        try:
            return cls.model_validate(_with_input(fields))
        except ValidationError as exc:
            raise MalformedMessage(_problems(exc)) from None

    @property
    def dedup_key(self) -> str:
        """Identity of one task attempt, ``<run_id>:<task_id>:<attempt>``: duplicates share it.

        ``%`` and ``:`` in the run id are escaped, so no two (run, task,
        attempt) triples share a key (the attempt, an integer, ends it).
        """
        return f"{dedup_run_part(self.run_id)}:{self.task_id}:{self.attempt}"


def parse_tasks(batch: Sequence[Mapping[str, str]]) -> list[TaskMessage | MalformedMessage]:
    """The tasks of many entries' fields, validated in one call; a bad entry is its own error.

    Each item is the entry's ``TaskMessage``, or the ``MalformedMessage`` that
    ``TaskMessage.from_fields`` would raise for it.
    """
    found: list[TaskMessage | MalformedMessage] = []
    valid: list[dict[str, Any]] = []
    where: list[int] = []
    for i, fields in enumerate(batch):
        try:
            valid.append(_with_input(fields))
        except MalformedMessage as exc:
            found.append(exc)
            continue
        found.append(_PENDING)
        where.append(i)
    tasks: list[TaskMessage | MalformedMessage]
    try:
        tasks = list(_TASKS.validate_python(valid))
    except ValidationError:  # which ones: each alone
        tasks = [_task_or_why(data) for data in valid]
    for i, task in zip(where, tasks, strict=True):
        found[i] = task
    return found


def _with_input(fields: Mapping[str, str]) -> dict[str, Any]:
    """The fields with ``input`` parsed from JSON; ``MalformedMessage`` if it is not JSON."""
    raw = fields.get("input", "null")
    if not raw:  # JSON null as the spec's publisher writes it (older entries carry "null")
        return {**fields, "input": None}
    try:
        # In Rust: a fraction of json.loads on the hot path. Object keys repeat from one
        # task to the next and are cached; values rarely repeat (1.48 us an input against
        # 1.71 caching both: 2026-12-03, benchmarks/NOTES.md, "Figures the code's comments
        # quote").
        value = from_json(raw, cache_strings="keys")
    except ValueError:
        try:  # the reference parser decides (deeper nesting, its own error messages)
            value = json.loads(raw)
        except ValueError as exc:
            raise MalformedMessage(f"field 'input' is not valid JSON: {exc}") from None
        except RecursionError:
            raise MalformedMessage("field 'input' is nested too deeply to parse") from None
    return {**fields, "input": value}


def _task_or_why(data: dict[str, Any]) -> TaskMessage | MalformedMessage:
    try:
        return TaskMessage.model_validate(data)
    except ValidationError as exc:
        return MalformedMessage(_problems(exc))


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"field {'.'.join(str(p) for p in e['loc'])!r}: {e['msg']}" for e in exc.errors()
    )


_TASKS = TypeAdapter(list[TaskMessage])
_PENDING = MalformedMessage("not parsed")  # a placeholder, always replaced
