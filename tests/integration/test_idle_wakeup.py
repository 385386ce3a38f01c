"""NOTIFY only while an enqueuer is idle: the flag, its announcements, and the race's cover."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.idle_flag import IDLE_FLAG_KEY
from dispatcher.redis_client import RedisClient
from tests.data import insert_rows
from tests.enqueuers import make_enqueuer, running
from tests.fix_db import announced
from tests.outbox_rows import outbox_status, published
from tests.waiting import eventually, eventually_sync


def notifications_after_insert(db_url: str, queue: str) -> list[str]:
    """Insert one row while LISTENing on another session; return what arrived (0.5 s window)."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN outbox_new")
        insert_rows(db_url, 1, queue=queue, prefix=f"n{uuid.uuid4().hex[:8]}-")
        return [n.channel for n in listener.notifies(timeout=0.5)]


def take_flag(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (IDLE_FLAG_KEY,)).fetchone()
    return bool(row and row[0])


def test_inserts_notify_only_while_someone_is_idle(outbox_db_url: str, queue: str) -> None:
    assert notifications_after_insert(outbox_db_url, queue) == []

    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        assert take_flag(conn)
        assert announced(outbox_db_url) == [conn.info.backend_pid]
        assert notifications_after_insert(outbox_db_url, queue) == ["outbox_new"]
    # The server ends a closed session's backend a moment after the client has gone.
    eventually_sync(lambda: announced(outbox_db_url) == [], what="the flag's session ended")
    assert notifications_after_insert(outbox_db_url, queue) == [], "the flag died with its session"


def test_the_flag_cannot_be_taken_while_an_insert_without_notify_is_open(
    outbox_db_url: str, queue: str
) -> None:
    """The race's cover: a commit that skipped NOTIFY always ends before the flag is taken."""
    with (
        psycopg.connect(outbox_db_url) as inserter,
        psycopg.connect(outbox_db_url, autocommit=True) as enqueuer,
    ):
        inserter.execute("INSERT INTO outbox (id, stream) VALUES ('open-1', 'workflow.tasks.x.0')")
        assert not take_flag(enqueuer), "the open insert holds the flag's lock shared"
        inserter.commit()
        assert take_flag(enqueuer)
        # From here every insert notifies.
        assert notifications_after_insert(outbox_db_url, queue) == ["outbox_new"]


async def test_enqueuer_announces_when_idle_and_withdraws_when_busy(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: len(announced(outbox_db_url)) == 1)
        # While announced, a commit wakes it within milliseconds (the poll is 30 s away).
        insert_rows(outbox_db_url, 3, queue=queue, prefix="a-")
        await eventually(lambda: _count(redis_standalone, queue, 3), within=10)

        # A claim that finds several rows withdraws the announcement; the enqueuer's own
        # empty claims that follow (two in a row) renew it.
        busy = enqueuer.config.busy_at_rows
        delay = await enqueuer.idle_flag.after_claim(
            count=busy, started=0.0, ended=time.monotonic(), full=False, can_listen=True
        )
        if delay is not None:
            enqueuer.signals.ring_in(delay)
        assert announced(outbox_db_url) == []
        await eventually(lambda: len(announced(outbox_db_url)) == 1)
    assert announced(outbox_db_url) == [], "a stopped enqueuer is not idle"


async def test_a_flag_lost_with_its_session_is_taken_again(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: len(announced(outbox_db_url)) == 1)
        (holder,) = announced(outbox_db_url)
        with psycopg.connect(outbox_db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (holder,))
        await eventually(lambda: announced(outbox_db_url) == [])
        assert enqueuer.idle_flag_held, "nothing has told it yet"

        await enqueuer.maintenance_once()  # notices the dead session, claims, retakes the flag
        await eventually(lambda: len(announced(outbox_db_url)) == 1)
        assert announced(outbox_db_url) != [holder]
        insert_rows(outbox_db_url, 1, queue=queue, prefix="again-")  # NOTIFY wakes it again
        await eventually(lambda: _count(redis_standalone, queue, 1), within=10)


async def test_a_lost_listener_withdraws_the_flag_until_it_is_back(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """Nobody hears NOTIFY while the LISTEN connection is down: the flag goes (the poll takes
    over, and the application's commits stop paying for NOTIFY), and comes back with it."""
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: len(announced(outbox_db_url)) == 1)
        with psycopg.connect(outbox_db_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'outbox-dispatcher-listener'"
            )
        await eventually(lambda: announced(outbox_db_url) == [], what="the flag withdrawn")
        await eventually(lambda: enqueuer.listener is not None and enqueuer.listener.connects == 2)
        await eventually(lambda: len(announced(outbox_db_url)) == 1, what="the flag again")
        insert_rows(outbox_db_url, 1, queue=queue, prefix="back-")  # NOTIFY wakes it again
        await eventually(lambda: _count(redis_standalone, queue, 1), within=10)


async def test_busy_enqueuer_drains_without_notifications(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """With nobody announced, rows committed during a drain are still all published."""
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: bool(announced(outbox_db_url)))
        ids = insert_rows(outbox_db_url, 2000, queue=queue, prefix="b-")  # full batches: withdraws
        more = insert_rows(outbox_db_url, 500, queue=queue, prefix="c-")
        await eventually(lambda: _count(redis_standalone, queue, 2500), within=30)
    got = sorted(e["outbox_id"] for e in await published(redis_standalone, queue))
    assert got == sorted(ids + more)
    assert outbox_status(outbox_db_url) == {}


async def _count(client: RedisClient, queue: str, n: int) -> bool:
    return len(await published(client, queue)) >= n
