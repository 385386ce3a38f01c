"""The claim's packed XADD commands are byte for byte what the enqueuer's own encoder writes.

PostgreSQL packs each claimed row's entry (``outbox_route`` and ``outbox_entry``);
where it cannot promise the enqueuer's bytes it leaves the row to the enqueuer
(command NULL). Both are held to the reference: ``route_stream`` and
``payload_fields`` applied to the payload's JSON text as PostgreSQL returns it
(the column is jsonb: keys come back sorted, numbers normalised, duplicates
dropped, before either encoder sees them).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from dispatcher.models import payload_fields
from dispatcher.outbox import OutboxRepository
from dispatcher.outbox.encoding import FALLBACK_STREAM
from dispatcher.stream.naming import fnv1a_32, route_stream
from dispatcher.stream.publisher import xadd_command

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

DISPATCH = {
    "task_id": "t8",
    "run_id": "r",
    "workflow_id": "wf",
    "workflow_version": 3,
    "node_id": "n",
    "node_type": "http",
    "attempt": 1,
    "input": '{"x": [1, 2.5]}',
}

# (payload as JSON text, or None for SQL NULL; whether PostgreSQL packs it itself)
CORPUS: dict[str, tuple[str | None, bool]] = {
    "dispatch": (json.dumps(DISPATCH), True),
    "unicode": ('{"task_id": "ü→😀", "input": "日本語", "k€y": "ǅ", "z": "\\ud83d\\ude00"}', True),
    "controls": ('{"a": "line\\nbreak\\ttab\\u0001\\u007f\\u001f", "b": "q\\"b\\\\s/"}', True),
    "integers": ('{"zero": 0, "neg0": -0, "neg": -12, "e3": 1e3, "E2": 2E+2, "x": 10}', True),
    "big int": ('{"big": 123456789012345678901234567890123456789}', True),
    "huge exponent": ('{"h": 1e400}', True),
    "literals": ('{"n": null, "t": true, "f": false}', True),
    "empty object": ("{}", True),
    "empty strings": ('{"": "", "e": ""}', True),
    "escaped keys": ('{"a\\"b": "x", "new\\nline": "y", "é": "z", "tab\\t": 1}', True),
    "outbox_id key": ('{"outbox_id": "spoof", "x": "y", "id": 7}', True),
    "look-alikes": (
        '{"s": "1.50", "t": "{\\"a\\": 1}", "u": "[1]", "v": "-5", "w": "null", "x": "true"}',
        True,
    ),
    "duplicate keys": ('{"k": 1, "k": "last"}', True),
    "4 KB": (json.dumps({"task_id": "big", "input": "ü" * 1000 + "x" * 2000}), True),
    "string payload": ('"just text"', True),
    "number payload": ("1.50", True),
    "boolean payload": ("true", True),
    "json null payload": ("null", True),
    "sql null payload": (None, True),
    "float 1.0": ('{"f": 1.0}', False),
    "float 1.50": ('{"f": 1.50}', False),
    "float tiny": ('{"f": 1e-7, "g": -0.0}', False),
    "float long": ('{"f": 3.14159265358979323846264338327950288}', False),
    "nested": ('{"o": {"z": 1, "a": [1, 2.5, "é", null]}, "arr": []}', False),
    "nested ascii": ('{"o": {"b": [1, 2], "a": "x y"}}', False),
    "array payload": ("[1, 2, 3]", False),
    "int over 640 digits": ('{"i": ' + "7" * 700 + "}", False),
    "int over the decoder's limit": ('{"i": ' + "7" * 5000 + "}", False),
    "deep": ('{"x": ' + "[" * 3000 + "]" * 3000 + "}", False),
    "trace": (f'{{"traceparent": "{TRACEPARENT}", "x": "y"}}', True),
}

STREAMS = [
    *("workflow.tasks.q", "workflow.tasks.q.7", "workflow.tasks.12", "workflow.tasks.a-b_C9.0"),
    *("workflow.tasks.a.b.1", "workflow.tasks.q.", "workflow.tasks..5", "workflow.tasks."),
    *("workflow.tasks", "workflow.tasks." + "a" * 200, "workflow.tasks." + "a" * 201),
    *("workflow.tasks." + "a" * 200 + ".3", "workflow.tasks.{tag}", "custom:stream", ""),
]


def reference(
    *, stream: str, task_id: str | None, row_id: str, payload: str | None, shards: int
) -> str:
    target = route_stream(stream or FALLBACK_STREAM, task_id or row_id, shards)
    return xadd_command(target, payload_fields(payload, row_id))


def insert(db_url: str, rows: list[tuple[str, str | None, str, str | None]]) -> None:
    with psycopg.connect(db_url) as conn:
        for row_id, task_id, stream, payload in rows:
            conn.execute(
                "INSERT INTO outbox (id, task_id, stream, payload) VALUES (%s, %s, %s, %s::jsonb)",
                (row_id, task_id, stream, payload),
            )


def stored_text(db_url: str) -> dict[str, str | None]:
    """Each row's payload as jsonb text: what the enqueuer's own encoder is given."""
    with psycopg.connect(db_url) as conn:
        return dict(conn.execute("SELECT id, payload::text FROM outbox").fetchall())


async def claim_all(
    pool: AsyncConnectionPool[Any], *, shards: int, keep: tuple[str, ...] = ()
) -> dict[str, Any]:
    repo = OutboxRepository(pool)
    async with repo.claim_batch(1000, hold_for=30, shards=shards, keep=keep) as batch:
        return {row.id: row for row in batch.rows}


@pytest.mark.parametrize("keep", [(), ("traceparent",)])
async def test_payloads_pack_to_the_same_bytes(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], keep: tuple[str, ...]
) -> None:
    insert(outbox_db_url, [(name, name, "workflow.tasks.q", p) for name, (p, _) in CORPUS.items()])
    texts = stored_text(outbox_db_url)

    claimed = await claim_all(pool, shards=4, keep=keep)

    assert set(claimed) == set(CORPUS)
    in_sql = {name for name, row in claimed.items() if row.command is not None}
    expected = {name for name, (_, packs) in CORPUS.items() if packs}
    if keep:
        expected.discard("trace")
    assert in_sql == expected, "PostgreSQL packs exactly the rows it can match"
    for name in in_sql:
        row = claimed[name]
        want = reference(
            stream=row.stream, task_id=name, row_id=name, payload=texts[name], shards=4
        )
        assert row.command == want, name
        assert row.payload is None, "the payload is not sent twice"
    for name in set(CORPUS) - in_sql:
        assert claimed[name].payload == texts[name], "left to the enqueuer, with its payload"


@pytest.mark.parametrize("shards", [0, 1, 4, 7])
async def test_streams_route_as_the_enqueuer_routes(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], shards: int
) -> None:
    task_ids = ["t8", "", None, "ü→😀", "task-" + "x" * 100]
    rows = [
        (f"r{i}-{j}", task_id, stream, '{"a": "b"}')
        for i, stream in enumerate(STREAMS)
        for j, task_id in enumerate(task_ids)
    ]
    insert(outbox_db_url, rows)

    claimed = await claim_all(pool, shards=shards)

    for row_id, task_id, stream, _ in rows:
        want = route_stream(stream or FALLBACK_STREAM, task_id or row_id, shards)
        assert claimed[row_id].target == want, (stream, task_id)


async def test_streams_outside_ascii_are_routed_by_the_enqueuer(
    outbox_db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    # To Python "٣" and "²" are digits: the stream names queue q. PostgreSQL leaves them.
    insert(outbox_db_url, [("a", "t", "workflow.tasks.q.٣", "{}"), ("b", "t", "wörk", "{}")])
    claimed = await claim_all(pool, shards=4)
    assert claimed["a"].target is None
    assert claimed["a"].command is None
    assert claimed["b"].target is None


texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))  # as jsonb
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
objects = st.dictionaries(texts, json_values, max_size=6)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=objects | json_values)
def test_any_json_packs_to_the_same_bytes_or_is_left_to_the_enqueuer(
    outbox_db_url: str, payload: Any
) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        text, command = conn.execute(
            "SELECT %(p)s::jsonb::text,"
            " (SELECT command FROM outbox_entry('s', %(p)s::jsonb, 'id1', '{}'))",
            {"p": json.dumps(payload)},
        ).fetchone() or (None, None)
    if command is not None:
        assert command == xadd_command("s", payload_fields(text, "id1"))


@given(task_id=texts)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fnv1a32_matches_go_numbers(outbox_db_url: str, task_id: str) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        row = conn.execute("SELECT outbox_fnv1a32(%s)", (task_id,)).fetchone()
    assert row is not None
    assert row[0] == fnv1a_32(task_id.encode())
