"""A row names only a task stream: control keys are out of reach of the application's role.

The application's INSERT-only role (``outbox_app``, ``sql/roles.sql``) writes rows whose
``stream`` names each key the system itself keeps in Redis. The schema refuses them
(migration 0012); where the check is missing (a table altered by hand, a row from before
it), the real enqueuer refuses them before any XADD and moves them to ``outbox_dlq`` with
the reason, while the healthy rows around them are published as usual. No control key is
created or changed. Rows written before the check move to ``outbox_dlq`` when it comes, and
are never replayed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import enqueue_dispatch, schema
from dispatcher.outbox.schema import available_migrations
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.replay import ReplayError, replay_outbox_dlq
from dispatcher.stream.cancel_keys import CANCEL_SIGNAL, CANCELLED_RUNS
from dispatcher.stream.limit_keys import alive_key, held_key, limits_key, tokens_key
from dispatcher.stream.naming import SHARDS_KEY, SHARDS_OWNER_KEY, dead_letter_stream
from dispatcher.worker.dedup import attempt_key
from tests.data import dispatch
from tests.enqueuers import make_enqueuer, running
from tests.fix_db import as_role, migrate_url
from tests.outbox_rows import outbox_status
from tests.waiting import eventually

QUEUE = "hq"

# Every key the system keeps besides the task streams, as a row might name it.
CONTROL_KEYS = [
    CANCELLED_RUNS,
    CANCEL_SIGNAL,
    limits_key(QUEUE),
    held_key(QUEUE),
    alive_key(QUEUE),
    tokens_key(QUEUE),
    attempt_key("R:v1:1"),
    SHARDS_KEY,
    SHARDS_OWNER_KEY,
    dead_letter_stream(QUEUE),
    # near misses of a task stream
    "workflow.tasks",
    "workflow.tasks.",
    "workflow.tasks.a.b.1",
    "workflow.tasks.{hq}.1",
    "workflow.tasks.hq\n",
    "",
]

INSERT = "INSERT INTO outbox (id, task_id, stream, payload) VALUES (%s, %s, %s, %s)"


def _payload(n: int) -> str:
    return f'{{"task_id": "bad-{n}", "run_id": "R", "attempt": 1, "input": "{{}}"}}'


def test_the_schema_refuses_a_row_naming_anything_but_a_task_stream(roles_db: str) -> None:
    with psycopg.connect(as_role(roles_db, "outbox_app")) as app:
        for n, key in enumerate(CONTROL_KEYS):
            with pytest.raises(psycopg.errors.CheckViolation):
                app.execute(INSERT, (f"bad-{n}", f"bad-{n}", key, _payload(n)))
            app.rollback()
        for n, stream in enumerate(
            ["workflow.tasks.hq", "workflow.tasks.hq.3", "workflow.tasks.a_b-C"]
        ):
            app.execute(INSERT, (f"ok-{n}", f"ok-{n}", stream, _payload(n)))
        app.commit()
    assert outbox_status(roles_db) == {"PENDING": 3}


async def _snapshot(client: RedisClient) -> dict[str, Any]:
    """Every control key's type and serialised value."""
    out: dict[str, Any] = {}
    for key in CONTROL_KEYS:
        if key:
            out[key] = (await client.type(key), await client.dump(key))
    return out


async def test_the_enqueuer_dead_letters_a_row_naming_a_control_key_and_touches_no_key(
    roles_db: str,
    redis_url: str,
) -> None:
    with psycopg.connect(roles_db, autocommit=True) as owner:
        # A row the schema's check never saw: written before it, or the check dropped by hand.
        owner.execute("ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_stream_check")
    client = connect_redis(redis_url)
    # The control keys as a running system holds them, so a change would show.
    await client.set(SHARDS_KEY, "4")
    await client.set(SHARDS_OWNER_KEY, '{"namespace": "ns", "name": "d", "uid": "u"}')
    await client.set(limits_key(QUEUE), '{"max_in_flight": 3}')
    await client.hset(held_key(QUEUE), "w1", "1")  # type: ignore[misc]
    await client.zadd(CANCELLED_RUNS, {"R0": 1})
    before = await _snapshot(client)

    with psycopg.connect(as_role(roles_db, "outbox_app")) as app:
        for n, key in enumerate(CONTROL_KEYS):
            enqueue_dispatch(app, dispatch(f"ok-{n}", QUEUE))
            app.execute(INSERT, (f"bad-{n}", f"bad-{n}", key, _payload(n)))
        app.commit()
    enqueuer_url = as_role(roles_db, "outbox_enqueuer")
    pool = AsyncConnectionPool(enqueuer_url, kwargs={"autocommit": True}, open=False)
    async with pool, running(make_enqueuer(pool, client, poll_interval=0.05)):
        await eventually(lambda: _all_gone(roles_db), within=30)

    assert await _snapshot(client) == before
    with psycopg.connect(roles_db) as owner:
        dead = owner.execute("SELECT stream, attempts, last_error FROM outbox_dlq").fetchall()
    assert sorted(stream for stream, _, _ in dead) == sorted(CONTROL_KEYS)
    for stream, attempts, error in dead:
        assert attempts == 1, stream  # at once: no retry of a row that can never publish
        assert "not a task stream" in error, error
    published = 0
    for shard in range(4):
        published += await client.xlen(f"workflow.tasks.{QUEUE}.{shard}")
    assert published == len(CONTROL_KEYS)
    await client.aclose()


def _all_gone(url: str) -> bool:
    return outbox_status(url).get("PENDING", 0) + outbox_status(url).get("RETRY", 0) == 0


@pytest.fixture
def at_0011(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database migrated through 0011, holding rows that name control keys."""
    before = [m for m in available_migrations() if m.version <= 11]
    with monkeypatch.context() as patch:
        patch.setattr(schema, "available_migrations", lambda: before)
        assert migrate_url(empty_db_url)[-1] == 11
    with psycopg.connect(empty_db_url) as conn:
        conn.execute(INSERT, ("good", "good", "workflow.tasks.hq.2", _payload(0)))
        conn.execute(INSERT, ("bad", "bad", CANCELLED_RUNS, _payload(1)))
        conn.execute(INSERT, ("bad-dlq", "bad-dlq", SHARDS_KEY, _payload(2)))
        conn.execute("UPDATE outbox SET status = 'DLQ', attempt_count = 6 WHERE id = 'bad-dlq'")
    return empty_db_url


def test_upgrading_moves_rows_naming_a_control_key_to_the_dlq(at_0011: str) -> None:
    assert migrate_url(at_0011) == [12]
    assert migrate_url(at_0011) == []
    with psycopg.connect(at_0011) as conn:
        assert conn.execute("SELECT id, stream FROM outbox").fetchall() == [
            ("good", "workflow.tasks.hq.2")
        ]
        dead = dict(conn.execute("SELECT id, last_error FROM outbox_dlq").fetchall())
        assert set(dead) == {"bad", "bad-dlq"}
        assert all("is not a task stream" in error for error in dead.values()), dead
        # Every row left is valid: the check holds for their updates (a retry, a dead letter).
        conn.execute("UPDATE outbox SET status = 'RETRY', attempt_count = 1")


def test_a_row_naming_a_control_key_is_never_replayed(at_0011: str) -> None:
    migrate_url(at_0011)

    async def replay() -> None:
        async with await psycopg.AsyncConnection.connect(at_0011, autocommit=True) as conn:
            await replay_outbox_dlq(conn, ids=["bad-dlq", "bad"])

    with pytest.raises(ReplayError, match="not a task stream"):
        asyncio.run(replay())
    with psycopg.connect(at_0011) as conn:
        dead = {r[0] for r in conn.execute("SELECT id FROM outbox_dlq").fetchall()}
    assert dead == {"bad", "bad-dlq"}, "nothing replayed"
