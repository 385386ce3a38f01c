"""The notification channel is open to every role that can connect: it carries nothing and is
trusted for nothing.

An idle enqueuer holds the flag, so commits NOTIFY ``outbox_new``. A role with
only ``CONNECT`` (PUBLIC's default) LISTENs and NOTIFYs on it: it must learn no
task, publish nothing, and never stop idle dispatch.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from dispatcher import enqueue_dispatch
from dispatcher.outbox.enqueuer import OutboxEnqueuer
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import task_stream
from tests.data import dispatch
from tests.enqueuers import make_enqueuer, running
from tests.fix_db import announced
from tests.waiting import eventually

SECRET = "4111-1111-1111-1111"


@pytest.fixture
def outsider(outbox_db_url: str) -> Iterator[str]:
    """A login role with nothing granted: only PUBLIC's CONNECT on the database."""
    role = f"outsider_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(outbox_db_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield psycopg.conninfo.make_conninfo(outbox_db_url, user=role)
    finally:
        with psycopg.connect(outbox_db_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")


def commit_dispatch(db_url: str, queue: str, task_id: str) -> None:
    secrets = {"card_number": SECRET, "api_token": "tok-" + SECRET}
    task = dispatch(task_id, queue, input=json.dumps(secrets))
    with psycopg.connect(db_url) as app:
        enqueue_dispatch(app, task)


async def idle(enqueuer: OutboxEnqueuer, db_url: str) -> None:
    await eventually(lambda: len(announced(db_url)) == 1 and enqueuer.ready())


def notify(url: str, payloads: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for payload in payloads:
            conn.execute("SELECT pg_notify('outbox_new', %s)", (payload,))


async def test_a_connect_only_role_that_listens_receives_no_payload(
    outbox_db_url: str,
    outsider: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await idle(enqueuer, outbox_db_url)
        with psycopg.connect(outsider, autocommit=True) as snoop:
            denied = psycopg.errors.InsufficientPrivilege
            with pytest.raises(denied):
                snoop.execute("SELECT * FROM outbox")
            snoop.execute("LISTEN outbox_new")
            commit_dispatch(outbox_db_url, queue, "t-secret")
            heard = [n.payload for n in snoop.notifies(timeout=5, stop_after=1)]
        await eventually(lambda: _stream_has(redis_standalone, queue, "t-secret"))
    assert heard, "an idle enqueuer's flag makes a commit notify"
    assert heard == [""] * len(heard), heard


async def test_a_forged_notification_publishes_nothing_and_is_logged_once(
    outbox_db_url: str,
    outsider: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    forged = [
        f'["forged-{i}", "{stream}", "forged-{i}"]\n{{"input": {{"amount": 1000000}}}}'
        for i, stream in enumerate(
            [task_stream(queue, 2), "attacker.chosen.key", f"workflow.tasks.{queue}"]
        )
    ]
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    caplog.set_level(logging.WARNING, logger="dispatcher.outbox.listener")
    async with running(enqueuer):
        await idle(enqueuer, outbox_db_url)
        notify(outsider, forged)
        # The idle path still works, and what it published is the committed row alone.
        commit_dispatch(outbox_db_url, queue, "t-real")
        await eventually(lambda: _stream_has(redis_standalone, queue, "t-real"))
        assert await _task_ids(redis_standalone, queue) == ["t-real"]
        assert not await redis_standalone.exists("attacker.chosen.key")
        await eventually(lambda: _ignored(enqueuer) == len(forged))
    warnings = [r for r in caplog.records if "notification" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


async def test_garbage_on_the_channel_leaves_idle_dispatch_working(
    outbox_db_url: str,
    outsider: str,
    pool: AsyncConnectionPool[Any],
    redis_standalone: RedisClient,
    queue: str,
) -> None:
    rng = random.Random(28)
    garbage = ["null", "[]", "[1]", '["a"]', "{}", "\n", "[null, null, null]\nnot json"]
    garbage += [
        "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 300))) for _ in range(1000)
    ]
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await idle(enqueuer, outbox_db_url)
        listener = enqueuer.listener
        assert listener is not None
        notify(outsider, garbage)
        for n in range(5):  # woken by each commit's notification (the poll is 30 s away)
            commit_dispatch(outbox_db_url, queue, f"t-after-{n}")
            await eventually(lambda n=n: _stream_has(redis_standalone, queue, f"t-after-{n}"))
        await eventually(lambda: _ignored(enqueuer) == len(garbage), within=30)
        assert (listener.connected, listener.connects) == (True, 1), "it never went down"
    assert await _task_ids(redis_standalone, queue) == [f"t-after-{n}" for n in range(5)]


def _ignored(enqueuer: OutboxEnqueuer) -> float:
    return enqueuer.metrics.notifications_ignored._value.get()  # type: ignore[attr-defined]


async def _task_ids(client: RedisClient, queue: str) -> list[str]:
    """The task ids of every entry in every stream of the test's Redis DB."""
    ids = []
    async for key in client.scan_iter(match="*"):
        if await client.type(key) == "stream":
            ids += [fields.get("task_id", repr(fields)) for _, fields in await client.xrange(key)]
    return sorted(ids)


async def _stream_has(client: RedisClient, queue: str, task_id: str) -> bool:
    return task_id in await _task_ids(client, queue)
