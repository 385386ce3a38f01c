"""Fuzzed outbox rows through a real enqueuer and worker: no loop dies, nothing vanishes.

Rows with arbitrary JSONB payloads (objects with any keys and values, arrays,
strings, numbers, null, SQL NULL) and a row aimed at a key of the wrong type
go through ``dispatcher enqueuer`` and ``dispatcher worker`` processes. Every
row ends published and then handled or dead-lettered (a malformed task, with
its reason), or, when Redis refuses it, in ``outbox_dlq``; both processes keep
running throughout.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.stream import DEFAULT_SHARDS, SHARDS_KEY, shard_for, task_stream
from dispatcher.stream.naming import dead_letter_stream
from tests.faults.harness import Pipeline
from tests.waiting import eventually_sync

# PostgreSQL's jsonb stores neither NUL nor a lone UTF-16 surrogate: no application can
# commit such a payload, so generating one only fails the INSERT in the test itself.
text = st.text(
    alphabet=st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=4),
    max_leaves=10,
)
task_like = st.fixed_dictionaries(
    {"task_id": text, "input": text},
    optional={"run_id": json_values, "workflow_version": json_values, "attempt": json_values},
)
payloads = st.one_of(st.none(), json_values, task_like)


@pytest.fixture
def running(own_pg_db_url: str, redis_url: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(
        scenario="fuzz",
        db_url=own_pg_db_url,
        redis_url=redis_url,
        recorder_url=redis_url,
        workdir=tmp_path,
    )
    p.enqueuer("--maintenance-interval", "0.3")
    p.worker("--max-deliveries", "2", "--reclaim-idle", "0.3")
    yield p
    alive = [proc.alive() for proc in p.procs]
    p.stop_all()
    assert all(alive), "a process died:\n" + "\n".join(proc.tail() for proc in p.procs)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=st.lists(payloads, min_size=1, max_size=40))
def test_fuzzed_payloads_are_handled_or_dead_lettered_and_no_loop_dies(
    running: Pipeline, rows: list[Any]
) -> None:
    p = running
    tag = uuid.uuid4().hex[:8]
    ids = [f"{tag}-{n}" for n in range(len(rows))]
    with psycopg.connect(p.db_url, autocommit=True) as conn:
        for outbox_id, payload in zip(ids, rows, strict=True):
            conn.execute(
                "INSERT INTO outbox (id, task_id, stream, payload, max_retries, backoff_seconds)"
                " VALUES (%s, %s, %s, %s::jsonb, 1, 1)",
                (
                    outbox_id,
                    outbox_id,
                    task_stream(p.queue, len(outbox_id) % 4),
                    None if payload is None else json.dumps(payload),
                ),
            )
    eventually_sync(
        lambda: not _unsettled(p, ids), within=60, what="every row handled or dead-lettered"
    )
    assert all(proc.alive() for proc in p.procs), [proc.tail() for proc in p.procs]


def test_a_row_aimed_at_a_key_of_the_wrong_type_ends_in_the_outbox_dlq(
    running: Pipeline,
) -> None:
    p = running
    shards = int(p.redis.get(SHARDS_KEY) or DEFAULT_SHARDS)  # the row's shard, as routed
    stream = task_stream(f"other{uuid.uuid4().hex[:6]}", shard_for("t", shards))  # not read
    p.redis.set(stream, "not a stream")  # XGROUP CREATE / XADD answer WRONGTYPE
    with psycopg.connect(p.db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (id, task_id, stream, payload, max_retries, backoff_seconds)"
            " VALUES ('wrongtype', 't', %s, '{}', 1, 1)",
            (stream,),
        )
        dlq = "SELECT last_error FROM outbox_dlq WHERE id = 'wrongtype'"
        error = eventually_sync(lambda: conn.execute(dlq).fetchone(), within=60)
    assert "WRONGTYPE" in str(error[0])
    assert all(proc.alive() for proc in p.procs)


def _unsettled(p: Pipeline, ids: list[str]) -> set[str]:
    with psycopg.connect(p.db_url) as conn:
        left = {r[0] for r in conn.execute("SELECT id FROM outbox WHERE id = ANY(%s)", (ids,))}
        dlq = {r[0] for r in conn.execute("SELECT id FROM outbox_dlq WHERE id = ANY(%s)", (ids,))}
    runs = {json.loads(r)["outbox_id"] for r in p.recorder.lrange(p.record_key, 0, -1)}  # type: ignore[union-attr]
    dead = {f.get("outbox_id") for _, f in p.redis.xrange(dead_letter_stream(p.queue))}
    return (set(ids) - runs - dead - dlq) | left
