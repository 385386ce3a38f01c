"""Bad input, fuzzed with hypothesis: payloads, stream fields, queue names and CLI flags.

Every input either works or fails with the one exception type its caller
handles (and a message that says what is wrong); nothing else escapes.
"""

from __future__ import annotations

import contextlib
import decimal
import io
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dispatcher.cli.main import UsageError, build_parser
from dispatcher.cli.outbox import _config
from dispatcher.models import MalformedMessage, TaskDispatch, TaskMessage, payload_fields
from dispatcher.outbox.claim import ClaimedBatch
from dispatcher.outbox.encoding import encode_batch
from dispatcher.stream.naming import (
    InvalidQueueName,
    Router,
    parse_task_stream,
    shard_for,
    task_stream,
    validate_queue,
)
from dispatcher.stream.publisher import xadd_command

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(payload=st.one_of(st.none(), st.text(), json_values.map(json.dumps)), outbox_id=st.text())
@example(payload="", outbox_id="1")
@example(payload="[1, 2]", outbox_id="2")
@example(payload='"just a string"', outbox_id="3")
@example(payload="{not json", outbox_id="4")
def test_any_payload_becomes_string_fields_with_the_outbox_id(
    payload: str | None, outbox_id: str
) -> None:
    fields = payload_fields(payload, outbox_id)
    assert fields["outbox_id"] == outbox_id
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    doc = _json_or_none(payload)
    if isinstance(doc, dict) and _go_decodes(doc):
        assert set(fields) == {*map(str, doc), "outbox_id"}
    elif payload is None or not payload.strip():
        assert fields == {"id": outbox_id, "outbox_id": outbox_id}
    else:
        assert fields == {"data": payload, "outbox_id": outbox_id}


@FAST
@given(fields=st.dictionaries(st.text(), st.text(), max_size=12))
@example(fields={"task_id": "t", "input": "{"})
@example(fields={"task_id": "", "run_id": "r"})
@example(fields={"workflow_version": "1e400"})
def test_any_stream_fields_parse_or_are_malformed(fields: dict[str, str]) -> None:
    outcome: TaskMessage | MalformedMessage
    try:
        outcome = TaskMessage.from_fields(fields)
    except MalformedMessage as exc:
        outcome = exc
    assert outcome.task_id if isinstance(outcome, TaskMessage) else str(outcome)


# A dispatch refuses NUL in its strings (PostgreSQL stores none; tests/unit/test_models.py).
no_nul = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])


@FAST
@given(
    task_id=st.text(no_nul, min_size=1),
    node=st.text(no_nul),
    version=st.integers(-(2**31), 2**31),
    task_input=json_values,
    extra=st.dictionaries(st.text(min_size=1), st.text(), max_size=3),
)
def test_a_dispatch_survives_the_wire_whatever_its_text(
    task_id: str, node: str, version: int, task_input: Any, extra: dict[str, str]
) -> None:
    dispatch = TaskDispatch(
        task_id=task_id,
        run_id=node,
        workflow_id=node,
        workflow_version=version,
        node_id=node,
        node_type=node,
        queue="q",
        input=json.dumps(task_input),
    )
    payload = dispatch.payload()
    message = TaskMessage.from_fields(payload_fields(json.dumps(payload), "42"))
    assert (message.task_id, message.node_id, message.workflow_version) == (task_id, node, version)
    assert message.input == task_input
    assert message.outbox_id == "42"


@FAST
@given(queue=st.text())
@example(queue="a.b")
@example(queue="{tag}")
@example(queue="x" * 201)
@example(queue="ok-queue_1")
def test_any_queue_name_is_accepted_or_rejected_clearly(queue: str) -> None:
    error = ""
    try:
        validate_queue(queue)
    except InvalidQueueName as exc:
        error = str(exc)
    if error:
        assert error.startswith("invalid queue name")
        with pytest.raises(ValueError, match=r"invalid queue name|must not contain NUL"):
            TaskDispatch(
                task_id="t",
                run_id="r",
                workflow_id="w",
                workflow_version=1,
                node_id="n",
                node_type="t",
                queue=queue,
            )
        return
    shard = shard_for(queue, 7)
    assert parse_task_stream(task_stream(queue, shard)) == (queue, shard)


@FAST
@given(stream=st.text())
def test_any_stream_name_parses_or_raises_value_error(stream: str) -> None:
    try:
        queue, shard = parse_task_stream(stream)
    except ValueError:
        return
    assert parse_task_stream(task_stream(queue, shard)) == (queue, shard)


ENQUEUER_NUMBERS = [
    *("--batch-size", "--concurrency", "--poll-interval", "--hung-batch-timeout"),
    "--recover-in-flight-after",
    *("--maintenance-interval", "--wait-replicas", "--publish-timeout", "--shutdown-timeout"),
    *("--shards", "--metrics-port"),
]
WORKER_NUMBERS = [
    *("--concurrency", "--max-runs", "--max-deliveries", "--reclaim-idle", "--shards"),
    *("--grace-period", "--lease-ttl", "--dedup-window", "--handler-timeout", "--metrics-port"),
]
flag_values = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e309", "0x10", "1_000", " 5 ", ""]),
    st.floats().map(str),
    st.integers().map(str),
)


@FAST
@given(flag=st.sampled_from(ENQUEUER_NUMBERS), value=flag_values)
@example(flag="--batch-size", value="--")  # argparse drops "--" before type= runs
def test_enqueuer_flags_are_finite_numbers_or_exit_2_with_one_error_line(
    flag: str, value: str
) -> None:
    args = _parse_or_exit(["enqueuer", f"{flag}={value}"])
    if args is None:
        return
    for name in (
        *("batch_size", "concurrency", "poll_interval", "hung_batch_timeout"),
        *("maintenance_interval", "publish_timeout", "shutdown_timeout"),
    ):
        assert math.isfinite(getattr(args, name)), (flag, value)
    error = "ok"
    try:
        _config(args)
    except UsageError as exc:
        error = str(exc)
    assert error  # a config, or a message saying what is wrong


@FAST
@given(flag=st.sampled_from(WORKER_NUMBERS), value=flag_values)
@example(flag="--concurrency", value="--")
def test_worker_flags_are_finite_numbers_or_exit_2_with_one_error_line(
    flag: str, value: str
) -> None:
    argv = [
        "worker",
        *("--queue", "q", "--handler", "tests.handlers:noop", f"{flag}={value}"),
    ]
    args = _parse_or_exit(argv)
    if args is None:
        return
    for name in ("reclaim_idle", "grace_period", "lease_ttl", "dedup_window", "handler_timeout"):
        assert math.isfinite(getattr(args, name)), (flag, value)


def _parse_or_exit(argv: list[str]) -> Any:
    stderr = io.StringIO()
    code: Any = None
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv)
    except SystemExit as exit:
        code = exit.code
    if code is not None:
        assert code == 2
        err = stderr.getvalue()
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1, err
        assert errors[0].startswith(f"dispatcher {argv[0]}: error: argument"), err
        return None


def _json_or_none(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _reference_fields(payload: str | None, outbox_id: str) -> dict[str, str]:
    """The contract, on the standard library alone (payload_fields parses faster and formats
    numbers its own way): the spec's publisher's scalars, nested values as compact JSON."""
    if payload is None or not payload.strip():
        return {"id": outbox_id, "outbox_id": outbox_id}
    doc = _json_or_none(payload)
    if not isinstance(doc, dict) or not _go_decodes(doc):
        return {"data": payload, "outbox_id": outbox_id}
    fields = {k: _go_written(v) for k, v in doc.items()}
    fields["outbox_id"] = outbox_id
    return fields


def _go_decodes(value: Any) -> bool:
    """Go's encoding/json takes it into interface{}: no NaN, no infinity, within float64."""
    if isinstance(value, dict):
        return all(_go_decodes(v) for v in value.values())
    if isinstance(value, list):
        return all(_go_decodes(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _go_written(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if value is None or isinstance(value, bool):
        return {None: "", True: "1", False: "0"}[value]
    number = float(value)
    for digits in range(1, 18):  # the fewest significant digits that read back the same
        text = f"{number:.{digits - 1}e}"
        if float(text) == number:
            break
    fixed = f"{decimal.Decimal(text):f}"
    return fixed.rstrip("0").rstrip(".") if "." in fixed else fixed


@FAST
@given(
    payload=st.one_of(
        json_values.map(json.dumps),
        st.dictionaries(st.text(), json_values, max_size=6).map(json.dumps),
    )
)
@example(payload='{"big": 123456789012345678901234567890123456789, "neg0": -0}')
@example(payload='{"lone": "\\ud800", "pair": "\\ud83d\\ude00"}')
@example(payload='{"inf": 1e400, "nan": NaN, "ninf": -Infinity, "f": 0.1e1}')
@example(payload='{"k": 1, "k": "last", "j": 2}')
@example(payload='{"deep": ' + "[" * 500 + "]" * 500 + "}")  # past pydantic-core's depth limit
def test_payload_fields_match_the_standard_decoder_byte_for_byte(payload: str) -> None:
    fields = payload_fields(payload, "o-1")
    want = _reference_fields(payload, "o-1")
    assert fields == want
    assert list(fields) == list(want)  # the field order is the entry's


@FAST
@given(
    payloads=st.lists(
        st.one_of(
            st.none(),
            st.text(max_size=12),
            json_values.map(json.dumps),
            st.dictionaries(st.text(max_size=10), json_values, max_size=6).map(json.dumps),
        ),
        min_size=1,
        max_size=4,
    )
)
@example(payloads=['{"a": 1.5e300, "b": false}', '{"k": 1, "k": "last"}'])
@example(payloads=['{"input": "mentions traceparent", "n": 2.5}', "", "[1]"])
def test_a_claimed_row_packs_the_entry_its_fields_make(payloads: list[str | None]) -> None:
    """The claim packs XADD from a flat argument list, a traced row from its fields (the
    span's context goes in): either way, an entry is the same bytes."""
    raw = [
        (f"id-{i}", "workflow.tasks.q", p, 0, 5, 1, 0.0, f"task-{i}")
        for i, p in enumerate(payloads)
    ]
    with contextlib.ExitStack() as spans:
        claimed = encode_batch(ClaimedBatch(None, uuid.uuid4(), raw), 4, spans)  # type: ignore[arg-type]

    assert claimed.failed == {}
    assert claimed.streams == [Router(4)("workflow.tasks.q", f"task-{i}") for i in range(len(raw))]
    assert claimed.commands == [
        xadd_command(stream, payload_fields(row[2], row[0]))
        for stream, row in zip(claimed.streams, raw, strict=True)
    ]
