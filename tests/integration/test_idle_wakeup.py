"""NOTIFY only while an enqueuer is idle: the flag, its announcements, and the race's cover."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox import OutboxRepository
from dispatcher.redis_client import RedisClient
from tests.fix_outbox import insert_rows, make_enqueuer, outbox_status, published, running
from tests.helpers import eventually


def notifications_after_insert(db_url: str, queue: str) -> list[str]:
    """Insert one row while LISTENing on another session; return what arrived (0.5 s window)."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN outbox_new")
        insert_rows(db_url, 1, queue=queue, prefix=f"n{uuid.uuid4().hex[:8]}-")
        return [n.channel for n in listener.notifies(timeout=0.5)]


def announced(db_url: str) -> list[str]:
    with psycopg.connect(db_url) as conn:
        return [r[0] for r in conn.execute("SELECT enqueuer FROM outbox_idle").fetchall()]


def test_inserts_notify_only_while_someone_is_idle(db_url: str, queue: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM outbox_idle")
    assert notifications_after_insert(db_url, queue) == []

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_idle (enqueuer, listener_pid) VALUES ('e1', pg_backend_pid())"
        )
        assert notifications_after_insert(db_url, queue) == ["outbox_new"]
        conn.execute("DELETE FROM outbox_idle")


async def test_enqueuer_announces_when_idle_and_withdraws_when_busy(
    db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: _is(announced(db_url) == [enqueuer.name]))
        # While announced, a commit wakes it within milliseconds (the poll is 30 s away).
        insert_rows(db_url, 3, queue=queue, prefix="a-")
        await eventually(lambda: _count(redis_standalone, queue, 3), within=10)

        # A claim that finds several rows withdraws the announcement; the enqueuer's own
        # empty claims that follow (two in a row) renew it.
        await enqueuer._after_batch(enqueuer.config.busy_at_rows)
        assert announced(db_url) == []
        await eventually(lambda: _is(announced(db_url) == [enqueuer.name]))
    assert announced(db_url) == [], "a stopped enqueuer is not idle"


async def test_busy_enqueuer_drains_without_notifications(
    db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """With nobody announced, rows committed during a drain are still all published."""
    enqueuer = make_enqueuer(pool, redis_standalone, listen=db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: _is(bool(announced(db_url))))
        ids = insert_rows(db_url, 2000, queue=queue, prefix="b-")  # full batches: withdraws
        more = insert_rows(db_url, 500, queue=queue, prefix="c-")
        await eventually(lambda: _count(redis_standalone, queue, 2500), within=30)
    got = sorted(e["outbox_id"] for e in await published(redis_standalone, queue))
    assert got == sorted(ids + more)
    assert outbox_status(db_url) == {}


async def test_announcements_of_dead_listeners_are_forgotten(
    db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox_idle (enqueuer, listener_pid) VALUES ('gone', 999999)")
        conn.execute(
            "INSERT INTO outbox_idle (enqueuer, listener_pid) VALUES ('alive', pg_backend_pid())"
        )
        assert await OutboxRepository(pool).forget_dead_listeners() == 1
        assert announced(db_url) == ["alive"]
        conn.execute("DELETE FROM outbox_idle")


async def _is(value: bool) -> bool:
    return value


async def _count(client: RedisClient, queue: str, n: int) -> bool:
    return len(await published(client, queue)) >= n
