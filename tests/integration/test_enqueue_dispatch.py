"""``enqueue_dispatch`` writes one row in the caller's transaction, sync and async."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from pydantic import ValidationError

from dispatcher.models import ReservedField, TaskDispatch
from dispatcher.outbox import enqueue_dispatch, enqueue_dispatch_async
from dispatcher.stream import queue_stream


def dispatch(task_id: str = "t8", queue: str = "http", **over: str) -> TaskDispatch:
    fields: dict[str, object] = {
        "task_id": task_id,
        "run_id": "r1",
        "workflow_id": "wf",
        "workflow_version": 2,
        "node_id": "n",
        "node_type": "http",
        "queue": queue,
        "attempt": 1,
        "input": '{"k": [1, 2]}',
    }
    return TaskDispatch.model_validate({**fields, **over})


def rows(url: str) -> list[tuple[str, str, str, dict[str, object], str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT id, task_id, stream, payload, status FROM outbox ORDER BY created_at"
        ).fetchall()


def test_sync_insert_commits_with_the_callers_transaction(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        outbox_id = enqueue_dispatch(conn, dispatch())
        assert rows(outbox_db_url) == []  # not visible before the caller commits
    (row,) = rows(outbox_db_url)
    assert row[0] == outbox_id
    assert row[1:3] == ("t8", queue_stream("http"))  # the shard is picked when published
    assert row[3]["input"] == '{"k": [1, 2]}'
    assert row[3]["workflow_version"] == 2
    assert row[4] == "PENDING"


def test_sync_insert_on_a_cursor_rolls_back_with_the_caller(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn, conn.cursor() as cur:
        enqueue_dispatch(cur, dispatch())
        conn.rollback()
    assert rows(outbox_db_url) == []


async def test_async_twin(outbox_db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(outbox_db_url) as conn:
        async with conn.transaction():
            await enqueue_dispatch_async(conn, dispatch("a1"))
            await enqueue_dispatch_async(conn.cursor(), dispatch("a2"))
        try:
            async with conn.transaction():
                await enqueue_dispatch_async(conn, dispatch("rolled-back"))
                raise RuntimeError("business logic failed")
        except RuntimeError:
            pass
    assert [r[1] for r in rows(outbox_db_url)] == ["a1", "a2"]


def test_not_before_must_be_timezone_aware(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn, pytest.raises(ValueError, match="timezone-aware"):
        enqueue_dispatch(conn, dispatch(), datetime.now() + timedelta(seconds=5))
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(outbox_db_url) as conn:
        enqueue_dispatch(conn, dispatch(), later)
        stored = conn.execute("SELECT next_attempt_at FROM outbox").fetchone()
    assert stored is not None
    assert stored[0] == later


def test_payload_is_the_message_without_its_queue(outbox_db_url: str) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        enqueue_dispatch(conn, dispatch())
    payload = rows(outbox_db_url)[0][3]
    assert "queue" not in payload
    assert json.loads(str(payload["input"])) == {"k": [1, 2]}


@pytest.mark.parametrize("field", ["task_id", "run_id", "workflow_id", "node_id", "node_type"])
def test_nul_is_refused_before_the_callers_transaction_sees_it(
    outbox_db_url: str, field: str
) -> None:
    with psycopg.connect(outbox_db_url) as conn:
        conn.execute("CREATE TEMP TABLE mine (n int)")
        conn.execute("INSERT INTO mine VALUES (1)")  # the application's own change
        with pytest.raises(ValidationError, match=field):
            enqueue_dispatch(conn, dispatch(**{field: "a\x00b"}))
        # The transaction is still usable: the caller's work goes on and commits.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        enqueue_dispatch(conn, dispatch())
    assert [r[1] for r in rows(outbox_db_url)] == ["t8"]


class WithOutboxId(TaskDispatch):
    """An application's own message type that adds a field the enqueuer adds too."""

    outbox_id: str = "mine"


def test_a_payload_key_the_pipe_adds_is_refused_and_the_transaction_goes_on(
    outbox_db_url: str,
) -> None:
    own = WithOutboxId.model_validate(dispatch("own").model_dump())
    with psycopg.connect(outbox_db_url) as conn:
        with pytest.raises(ReservedField, match="payload key 'outbox_id' is reserved"):
            enqueue_dispatch(conn, own)
        enqueue_dispatch(conn, dispatch("next"))  # nothing was sent: the transaction is usable
    assert [r[1] for r in rows(outbox_db_url)] == ["next"]
