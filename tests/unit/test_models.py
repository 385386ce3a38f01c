"""The wire format: dispatch payload -> stream fields -> task message."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dispatcher.models import MalformedMessage, TaskDispatch, TaskMessage, payload_fields


def dispatch(**over: object) -> TaskDispatch:
    base: dict[str, object] = {
        "task_id": "t8",
        "run_id": "r1",
        "workflow_id": "wf",
        "workflow_version": 3,
        "node_id": "n1",
        "node_type": "http",
        "queue": "http",
        "attempt": 2,
        "input": '{"url": "https://example.test", "n": [1, 2]}',
    }
    base.update(over)
    return TaskDispatch.model_validate(base)


def test_round_trip_dispatch_to_message() -> None:
    d = dispatch()
    fields = payload_fields(json.dumps(d.payload()), "ob-1")
    assert fields["task_id"] == "t8"
    assert fields["workflow_version"] == "3"
    assert fields["input"] == d.input  # travels as the JSON text it was written as
    assert fields["outbox_id"] == "ob-1"
    msg = TaskMessage.from_fields(fields)
    assert msg.input == {"url": "https://example.test", "n": [1, 2]}
    assert (msg.task_id, msg.attempt, msg.workflow_version) == ("t8", 2, 3)
    assert msg.dedup_key == "r1:t8:2"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (None, {"id": "o", "outbox_id": "o"}),
        ("", {"id": "o", "outbox_id": "o"}),
        ("[1,2]", {"data": "[1,2]", "outbox_id": "o"}),
        ('"text"', {"data": '"text"', "outbox_id": "o"}),
        ("not json", {"data": "not json", "outbox_id": "o"}),
        (
            '{"a": 1, "b": "x", "c": {"d": null}}',
            {"a": "1", "b": "x", "c": '{"d":null}', "outbox_id": "o"},
        ),
    ],
)
def test_payload_fields_contract(payload: str | None, expected: dict[str, str]) -> None:
    assert payload_fields(payload, "o") == expected


def test_invalid_dispatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid queue name"):
        dispatch(queue="bad queue")
    with pytest.raises(ValueError, match="input must be JSON text"):
        dispatch(input="{nope")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"task_id": "t"}, "field 'run_id'"),
        (
            {**payload_fields(json.dumps(dispatch().payload()), "o"), "input": "{bad"},
            "'input' is not valid JSON",
        ),
        (
            {**payload_fields(json.dumps(dispatch().payload()), "o"), "attempt": "two"},
            "field 'attempt'",
        ),
    ],
)
def test_malformed_entries_say_what_is_wrong(fields: dict[str, str], problem: str) -> None:
    with pytest.raises(MalformedMessage, match=problem):
        TaskMessage.from_fields(fields)


STRING_FIELDS = ("task_id", "run_id", "workflow_id", "node_id", "node_type", "queue", "input")


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_nul_in_a_string_field_is_refused_naming_the_field(field: str) -> None:
    # PostgreSQL stores no NUL in text or jsonb: refused here, before any connection sees it.
    value = '"a\x00b"' if field == "input" else "a\x00b"
    with pytest.raises(ValidationError) as caught:
        dispatch(**{field: value})
    (error,) = caught.value.errors()
    assert error["loc"] == (field,)
    assert "NUL" in error["msg"]
