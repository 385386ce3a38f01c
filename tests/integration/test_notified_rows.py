"""Rows committed while an enqueuer is idle go out straight from their notification.

The idle enqueuer (the flag holder) publishes a row from the NOTIFY payload
the trigger sends with it, without claiming it first, and deletes it after.
What must hold either way: every row reaches its stream once, with exactly the
fields the claim path gives it; a row not due yet waits; a row too big for a
notification still arrives (by the claim); Redis down hands rows to the claim
path's retries; two enqueuers lose nothing. Each holds whether the event loop
publishes the rows or the listener's thread does (the command line's enqueuer
on standalone Redis), and the thread publishes while the event loop is busy.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid
from typing import Any

import psycopg
import pytest
import redis as sync_redis
from psycopg_pool import AsyncConnectionPool

from dispatcher._testing.data import insert_rows
from dispatcher._testing.servers import RedisProcess
from dispatcher._testing.waiting import eventually
from dispatcher.outbox import OutboxEnqueuer
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import queue_streams
from tests.enqueuers import make_enqueuer, running
from tests.fix_db import charged
from tests.outbox_rows import dead_letters, outbox_status

INSERT = """
INSERT INTO outbox (id, task_id, stream, payload, type, next_attempt_at)
VALUES (%(id)s, %(task_id)s, %(stream)s, %(payload)s::jsonb, 'TASK_EXECUTION',
        now() + make_interval(secs => %(later)s))
"""

# Payload shapes the contract maps differently: strings, numbers, nested values, unicode,
# a non-object, no payload at all.
PAYLOADS: list[str | None] = [
    json.dumps({"task_id": "t", "run_id": "r", "attempt": 1, "input": '{"x": 1}'}),
    json.dumps({"n": 1.5, "big": 10**20, "nested": {"a": [1, "b", None]}, "flag": True}),
    json.dumps({"text": 'caf\u00e9 \u2603 \\ " \n', "empty": ""}),
    json.dumps([1, 2, 3]),
    json.dumps("just a string"),
    None,
]


THREAD = "listener thread"


@pytest.fixture(params=["event loop", THREAD])
def by(request: pytest.FixtureRequest) -> str:
    """Who publishes the notified rows."""
    return str(request.param)


def publisher_url(by: str, url: str) -> str | None:
    """The enqueuer's ``thread_redis_url`` for ``by``."""
    return url if by == THREAD else None


def notified(enqueuer: OutboxEnqueuer) -> float:
    """Rows the enqueuer published from their notifications."""
    registry = enqueuer.metrics.registry
    return registry.get_sample_value("dispatcher_outbox_notified_rows_total") or 0.0


def commit_row(
    outbox_db_url: str, row_id: str, *, queue: str, payload: str | None, later: float = 0.0
) -> None:
    """One row in its own transaction; ``later`` seconds ahead makes it due later."""
    with psycopg.connect(outbox_db_url, autocommit=True) as conn:
        conn.execute(INSERT, _params(row_id, queue, payload, later))


async def commit_rows(
    outbox_db_url: str, ids: list[str], *, queue: str, payload: str | None, gap: float
) -> None:
    """One transaction per row, ``gap`` seconds apart, without blocking the event loop."""
    async with await psycopg.AsyncConnection.connect(outbox_db_url, autocommit=True) as conn:
        for row_id in ids:
            await conn.execute(INSERT, _params(row_id, queue, payload, 0.0))
            await asyncio.sleep(gap)


def _params(row_id: str, queue: str, payload: str | None, later: float) -> dict[str, Any]:
    stream = f"workflow.tasks.{queue}"
    return {"id": row_id, "task_id": row_id, "stream": stream, "payload": payload, "later": later}


async def entries(client: RedisClient, queue: str) -> dict[str, list[list[tuple[str, str]]]]:
    """Every entry of the queue's shards by outbox id: (stream, field) pairs in stored order."""
    found: dict[str, list[list[tuple[str, str]]]] = collections.defaultdict(list)
    for stream in queue_streams([queue], 4):
        for _id, fields in await client.xrange(stream):
            found[fields["outbox_id"]].append([("_stream", stream), *fields.items()])
    return found


async def idle(enqueuer: OutboxEnqueuer) -> None:
    async def holds() -> bool:
        return enqueuer.idle_announced

    await eventually(holds)


async def count(client: RedisClient, queue: str, n: int) -> bool:
    return sum(len(v) for v in (await entries(client, queue)).values()) >= n


async def test_rows_committed_while_idle_arrive_once_with_the_claim_paths_fields(
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_url: str,
    redis_standalone: RedisClient,
    queue: str,
    by: str,
) -> None:
    ids = [f"n{i}" for i in range(len(PAYLOADS))]
    enqueuer = make_enqueuer(
        pool,
        redis_standalone,
        listen=outbox_db_url,
        poll_interval=30,
        thread_redis_url=publisher_url(by, redis_url),
    )
    async with running(enqueuer):
        await idle(enqueuer)
        for n, (row_id, payload) in enumerate(zip(ids, PAYLOADS, strict=True), 1):
            await commit_rows(outbox_db_url, [row_id], queue=queue, payload=payload, gap=0)
            await eventually(lambda n=n: count(redis_standalone, queue, n))
        await eventually(lambda: _is(outbox_status(outbox_db_url) == {}))
    assert notified(enqueuer) == len(ids), "published from their notifications"
    # by the listener's thread in that mode (which makes each shard's group too)
    assert (enqueuer.notified.thread_rows > 0) is (by == THREAD)
    fast = await entries(redis_standalone, queue)
    assert sorted(fast) == sorted(ids)
    assert all(len(copies) == 1 for copies in fast.values()), "no duplicates"

    # The same rows again, through the claim path this time.
    for stream in queue_streams([queue], 4):
        await redis_standalone.delete(stream)
    for row_id, payload in zip(ids, PAYLOADS, strict=True):
        commit_row(outbox_db_url, row_id, queue=queue, payload=payload)
    claimer = make_enqueuer(pool, redis_standalone)
    assert await claimer.process_batch() == len(ids)
    assert await entries(redis_standalone, queue) == fast


async def test_a_burst_while_idle_arrives_exactly_once(
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_url: str,
    redis_standalone: RedisClient,
    queue: str,
    by: str,
) -> None:
    """Many rows at once: the notifications and the claims that follow share them out."""
    enqueuer = make_enqueuer(
        pool,
        redis_standalone,
        listen=outbox_db_url,
        poll_interval=30,
        thread_redis_url=publisher_url(by, redis_url),
    )
    async with running(enqueuer):
        await idle(enqueuer)
        ids = insert_rows(outbox_db_url, 1500, queue=queue, prefix="burst-")
        ids += [f"one-{i}" for i in range(20)]
        await commit_rows(outbox_db_url, ids[1500:], queue=queue, payload=PAYLOADS[0], gap=0.002)
        await eventually(lambda: _is(outbox_status(outbox_db_url) == {}), within=60)
    got = await entries(redis_standalone, queue)
    assert sorted(got) == sorted(ids)
    assert [i for i, copies in got.items() if len(copies) > 1] == [], "duplicates"


async def test_a_row_due_later_is_not_published_early(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await idle(enqueuer)
        commit_row(outbox_db_url, "later", queue=queue, payload=PAYLOADS[0], later=3600)
        # Notifications arrive in commit order: once this one is out, the first was handled.
        commit_row(outbox_db_url, "now", queue=queue, payload=PAYLOADS[0])
        await eventually(lambda: count(redis_standalone, queue, 1))
        await eventually(lambda: _is(outbox_status(outbox_db_url) == {"PENDING": 1}))
        assert sorted(await entries(redis_standalone, queue)) == ["now"]

        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            conn.execute("UPDATE outbox SET next_attempt_at = now() WHERE id = 'later'")
        enqueuer.wake()
        await eventually(lambda: count(redis_standalone, queue, 2))
    assert sorted(await entries(redis_standalone, queue)) == ["later", "now"]


async def test_a_row_too_big_for_a_notification_still_arrives(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    big = json.dumps({"task_id": "big", "input": "x" * 9000})
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await idle(enqueuer)
        commit_row(outbox_db_url, "big", queue=queue, payload=big)
        await eventually(lambda: count(redis_standalone, queue, 1))
    assert notified(enqueuer) == 0, "it went by the claim"
    ((fields,),) = (await entries(redis_standalone, queue)).values()
    assert dict(fields)["input"] == "x" * 9000
    assert outbox_status(outbox_db_url) == {}


async def test_redis_down_hands_notified_rows_to_the_claim_paths_retries(
    audited: str, pool: AsyncConnectionPool[Any], redis_process: RedisProcess, queue: str, by: str
) -> None:
    outbox_db_url = audited
    client = connect_redis(redis_process.url, socket_timeout=1)
    enqueuer = make_enqueuer(
        pool,
        client,
        listen=outbox_db_url,
        poll_interval=30,
        publish_timeout=2,
        thread_redis_url=publisher_url(by, redis_process.url),
    )
    try:
        async with running(enqueuer):
            await idle(enqueuer)
            redis_process.stop()
            ids = [f"down-{i}" for i in range(3)]
            await commit_rows(outbox_db_url, ids, queue=queue, payload=PAYLOADS[0], gap=0)
            await eventually(lambda: _is(enqueuer.notified.failed_batches > 0))
            # The claim path takes them at once and retries them with backoff, as any row
            # whose publish failed: nothing waits on the idle path.
            await eventually(lambda: _is(outbox_status(outbox_db_url) == {"RETRY": 3}), within=30)
            redis_process.start()
            await eventually(lambda: count(client, queue, 3), within=30)
            await eventually(lambda: _is(outbox_status(outbox_db_url) == {}))
        assert sorted(await entries(client, queue)) == ids
        assert dead_letters(outbox_db_url) == {}
    finally:
        await client.aclose()


async def test_with_wait_replicas_a_row_too_few_replicas_have_is_not_deleted(
    audited: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """No replica acknowledges (this Redis has none): WAIT fails, so the row stays, and the
    claim path, not this one, counts the attempt."""
    outbox_db_url = audited
    enqueuer = make_enqueuer(
        pool, redis_standalone, listen=outbox_db_url, poll_interval=30, wait_replicas=1
    )
    async with running(enqueuer):
        await idle(enqueuer)
        await commit_rows(outbox_db_url, ["w"], queue=queue, payload=PAYLOADS[0], gap=0)
        await eventually(lambda: _is(outbox_status(outbox_db_url) == {"RETRY": 1}), within=30)
    assert enqueuer.notified.failed_batches == 1, "tried from its notification first"
    assert notified(enqueuer) == 0
    assert charged(outbox_db_url) == {"w"}


async def test_two_enqueuers_at_idle_lose_nothing(
    outbox_db_url: str, redis_url: str, redis_standalone: RedisClient, queue: str, by: str
) -> None:
    pools = [
        AsyncConnectionPool(
            outbox_db_url, min_size=1, max_size=6, kwargs={"autocommit": True}, open=False
        )
        for _ in range(2)
    ]
    clients = [connect_redis(redis_url) for _ in range(2)]
    for p in pools:
        await p.open(wait=True)
    enqueuers = [
        make_enqueuer(
            p,
            c,
            listen=outbox_db_url,
            poll_interval=0.2,
            thread_redis_url=publisher_url(by, redis_url),
        )
        for p, c in zip(pools, clients, strict=True)
    ]
    ids = [f"two-{uuid.uuid4().hex[:6]}-{i}" for i in range(200)]
    try:
        async with running(enqueuers[0]), running(enqueuers[1]):
            await eventually(lambda: _is(any(e.idle_announced for e in enqueuers)))
            await commit_rows(outbox_db_url, ids, queue=queue, payload=PAYLOADS[0], gap=0.005)
            await eventually(lambda: _is(outbox_status(outbox_db_url) == {}), within=60)
        got = await entries(redis_standalone, queue)
        assert sorted(got) == sorted(ids), "every row at least once"
        duplicates = sum(len(copies) - 1 for copies in got.values())
        print(f"two enqueuers at idle: {duplicates} duplicates in {len(ids)} rows")
    finally:
        for c in clients:
            await c.aclose()
        for p in pools:
            await p.close()


async def test_the_listeners_thread_publishes_while_the_event_loop_is_busy(
    outbox_db_url: str,
    pool: AsyncConnectionPool[Any],
    redis_url: str,
    redis_standalone: RedisClient,
    queue: str,
) -> None:
    """A row committed while the event loop is stuck reaches its stream all the same: the
    listener's thread publishes it (the event loop only deletes it, once it runs again)."""
    enqueuer = make_enqueuer(
        pool, redis_standalone, listen=outbox_db_url, poll_interval=30, thread_redis_url=redis_url
    )
    async with running(enqueuer):
        await idle(enqueuer)
        # Warm: the thread makes the stream's group, the loop deletes the row.
        await commit_rows(outbox_db_url, ["first"], queue=queue, payload=PAYLOADS[0], gap=0)
        await eventually(lambda: count(redis_standalone, queue, 1))
        found = _commit_and_watch(outbox_db_url, redis_url, queue, "while-busy")  # blocks
        await eventually(lambda: _is(outbox_status(outbox_db_url) == {}))
    assert found, "published while the event loop could not run"
    assert notified(enqueuer) == 2
    assert enqueuer.notified.thread_rows == 2
    assert sorted(await entries(redis_standalone, queue)) == ["first", "while-busy"]


def _commit_and_watch(outbox_db_url: str, redis_url: str, queue: str, row_id: str) -> bool:
    """Commit a row and wait (up to 10 s) for its entry, blocking the event loop throughout."""
    commit_row(outbox_db_url, row_id, queue=queue, payload=PAYLOADS[0])
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for stream in queue_streams([queue], 4):
                if any(f.get("outbox_id") == row_id for _, f in client.xrange(stream)):
                    return True
            time.sleep(0.01)
        return False
    finally:
        client.close()


async def _is(value: bool) -> bool:
    return value
