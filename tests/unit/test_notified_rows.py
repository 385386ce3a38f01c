"""The idle path's pure parts: reading a row notification, and who publishes which row."""

from __future__ import annotations

import json

import pytest

from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.notified import parse_notification
from dispatcher.outbox.outcomes import ClaimedRow


def row(row_id: str) -> ClaimedRow:
    return ClaimedRow(row_id, "workflow.tasks.q", "{}", 0, 5, 5, 0.0, row_id)


def test_a_row_notification_is_read_back_exactly() -> None:
    payload = '{"a": "line\\nbreak", "b": [1, 2.50]}'
    message = json.dumps(["id-1", "workflow.tasks.q", "t-1"]) + "\n" + payload
    parsed = parse_notification(message)
    assert parsed is not None
    assert (parsed.id, parsed.stream, parsed.task_id) == ("id-1", "workflow.tasks.q", "t-1")
    assert parsed.payload == payload, "the payload's text, byte for byte"
    assert parsed.attempt_count == 0


def test_no_payload_no_task_id_and_the_plain_wake_up() -> None:
    parsed = parse_notification('["id-2", "workflow.tasks.q", null]')
    assert parsed is not None
    assert (parsed.payload, parsed.task_id) == (None, None)
    assert parse_notification("") is None


@pytest.mark.parametrize(
    ("message", "says"),
    [("{", "Expecting"), ('["only-one"]', "values to unpack"), ("[1, 2, 3]", "id and stream")],
)
def test_an_unreadable_notification_raises(message: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_notification(message)


def test_a_row_goes_out_by_whichever_path_registers_it_first() -> None:
    inflight = InFlight()
    assert inflight.notify([row("a"), row("b"), row("a")]) == [row("a"), row("b")]
    # A claim that locked "b" (out from its notification) and "c" lets go of both.
    assert not inflight.claim(["b", "c"])
    assert inflight.notify([row("c")]) == [row("c")], "not registered by that claim"
    inflight.release(["a", "b", "c"])
    assert inflight.claim(["c", "d"])
    # Notified while claimed, or after a claim took it: not published twice.
    assert inflight.notify([row("d")]) == []
    inflight.unclaim(["c", "d"])
    assert inflight.notify([row("d")]) == [], "a claim took it lately"


def test_what_claims_took_is_remembered_within_a_bound() -> None:
    """The last ``remember`` ids a claim took are kept; none older than twice that."""
    remember = 3
    ids = [f"r{i}" for i in range(20)]
    for i in ids:
        inflight = InFlight(remember=remember)
        for taken in ids[: ids.index(i) + 1]:
            assert inflight.claim([taken])
            inflight.unclaim([taken])
        recent = set(ids[: ids.index(i) + 1][-remember:])
        published = {r.id for r in inflight.notify([row(x) for x in ids])}
        assert not published & recent, f"after {i}: a recent take published again"
        too_old = set(ids[: max(0, ids.index(i) + 1 - 2 * remember)])
        assert too_old <= published, f"after {i}: {sorted(too_old - published)} never forgotten"
