"""The wire format: dispatch payload -> stream fields -> task message."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dispatcher.models import (
    MalformedMessage,
    ReservedField,
    TaskDispatch,
    TaskMessage,
    go_scalar,
    payload_fields,
)


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


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        # What go-redis v9 writes for what encoding/json decoded (float64 for every number).
        (None, ""),
        (True, "1"),
        (False, "0"),
        ("as is", "as is"),
        ("", ""),
        (0, "0"),
        (-7, "-7"),
        (2**53, "9007199254740992"),
        (2**53 + 1, "9007199254740992"),  # float64 has no closer value
        (12345678901234567890, "12345678901234567000"),
        (1.0, "1"),
        (-0.0, "-0"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (1e21, "1000000000000000000000"),
        (1.5e-7, "0.00000015"),
        (-1.2345e-5, "-0.000012345"),
        (1.7976931348623157e308, "17976931348623157" + "0" * 292),
        (5e-324, "0." + "0" * 323 + "5"),
    ],
)
def test_scalars_are_written_as_the_spec_publisher_writes_them(value: object, wire: str) -> None:
    assert go_scalar(value) == wire
    assert payload_fields(json.dumps({"v": value}), "o")["v"] == wire


@pytest.mark.parametrize(
    "payload",
    ['{"n": 1' + "0" * 400 + ', "s": "x"}', '{"n": NaN}', '{"n": -Infinity}', '{"o": {"n": NaN}}'],
)
def test_a_payload_go_cannot_decode_is_published_as_raw_data(payload: str) -> None:
    # The spec's json.Unmarshal refuses numbers beyond float64 (and NaN), and it then
    # publishes {"data": <raw text>}: so do we.
    assert payload_fields(payload, "o") == {"data": payload, "outbox_id": "o"}


def test_nested_values_are_compact_json() -> None:
    fields = payload_fields('{"o": {"a": [1, true, null, 2.50]}, "l": ["é"]}', "o")
    assert fields == {"o": '{"a":[1,true,null,2.5]}', "l": '["\\u00e9"]', "outbox_id": "o"}


def test_a_payload_with_its_own_outbox_id_is_refused() -> None:
    with pytest.raises(ReservedField, match="payload key 'outbox_id' is reserved"):
        payload_fields('{"outbox_id": "mine", "a": 1}', "o")


class WithOutboxId(TaskDispatch):
    outbox_id: str = "mine"


class WithError(TaskDispatch):
    error: str = "mine"


@pytest.mark.parametrize(("kind", "key"), [(WithOutboxId, "outbox_id"), (WithError, "error")])
def test_a_dispatch_with_a_field_the_pipe_adds_is_refused(
    kind: type[TaskDispatch], key: str
) -> None:
    message = kind.model_validate(dispatch().model_dump())
    with pytest.raises(ReservedField, match=f"payload key '{key}' is reserved"):
        message.payload()


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        ("", None),  # null, as the spec's publisher writes it
        ("null", None),  # entries written before the wire format matched it
        ("true", True),
        ("false", False),
        ("1", 1),
        ("0", 0),
        ('"text"', "text"),
        ('{"a":[1,true,null]}', {"a": [1, True, None]}),
    ],
)
def test_input_reads_old_and_new_entries(wire: str, value: object) -> None:
    fields = {**payload_fields(json.dumps(dispatch().payload()), "o"), "input": wire}
    assert TaskMessage.from_fields(fields).input == value


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
