"""The enqueuer against real PostgreSQL and Redis: publish, claim bounds, retries, DLQ, listener."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.outbox import OutboxRepository, enqueue_dispatch
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import publish_shard_count, shard_for, task_stream
from tests.data import insert_rows
from tests.enqueuers import make_enqueuer, running
from tests.outbox_rows import outbox_status, published
from tests.waiting import eventually


def dispatch(task_id: str, queue: str) -> TaskDispatch:
    return TaskDispatch(
        task_id=task_id,
        run_id="r1",
        workflow_id="wf",
        workflow_version=3,
        node_id="n1",
        node_type="http",
        queue=queue,
        attempt=1,
        input='{"url": "https://x.test"}',
    )


async def test_committed_dispatch_reaches_its_shard_and_rolled_back_never_does(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=30)
    async with running(enqueuer):
        await eventually(lambda: _true(enqueuer.listener and enqueuer.listener.connected))
        with psycopg.connect(outbox_db_url) as conn:
            enqueue_dispatch(conn, dispatch("rolled-back", queue))
            conn.rollback()
            outbox_id = enqueue_dispatch(conn, dispatch("t8", queue))
        # The poll interval is 30 s: only the NOTIFY wake-up can publish this in time.
        await eventually(lambda: _has_entries(redis_standalone, queue, 1), within=10)

    (entry,) = await published(redis_standalone, queue)
    assert entry["_stream"] == task_stream(queue, shard_for("t8", 4))
    assert entry["outbox_id"] == outbox_id
    message = TaskMessage.from_fields({k: v for k, v in entry.items() if k != "_stream"})
    assert (message.task_id, message.workflow_version) == ("t8", 3)
    assert message.input == {"url": "https://x.test"}
    assert outbox_status(outbox_db_url) == {}


async def test_not_before_is_never_published_early(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    not_before = datetime.now(UTC) + timedelta(seconds=1.5)
    with psycopg.connect(outbox_db_url) as conn:
        enqueue_dispatch(conn, dispatch("later", queue), not_before)
    enqueuer = make_enqueuer(pool, redis_standalone, poll_interval=0.1)
    async with running(enqueuer):
        await eventually(lambda: _has_entries(redis_standalone, queue, 1), within=10)
    stream = task_stream(queue, shard_for("later", 4))
    ((entry_id, _),) = await redis_standalone.xrange(stream)
    stored_at_ms = int(entry_id.split("-")[0])  # Redis's clock, same machine
    assert stored_at_ms >= not_before.timestamp() * 1000


async def test_claim_never_exceeds_the_batch_size_under_concurrency(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], queue: str
) -> None:
    insert_rows(outbox_db_url, 10_000, queue=queue)
    repo = OutboxRepository(pool)
    sizes: list[int] = []
    claimed: list[str] = []

    async def claimer() -> None:
        while True:
            async with repo.claims.claim_batch(50, hold_for=30) as batch:
                if not batch.rows:
                    return
                sizes.append(len(batch.rows))
                claimed.extend(r.id for r in batch.rows)
                await batch.settle([r.id for r in batch.rows])

    await asyncio.gather(*(claimer() for _ in range(8)))

    assert max(sizes) <= 50
    assert len(claimed) == len(set(claimed)) == 10_000


async def test_two_enqueuers_publish_every_row_exactly_once(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_url: str, queue: str
) -> None:
    ids = insert_rows(outbox_db_url, 10_000, queue=queue)
    clients = [connect_redis(redis_url), connect_redis(redis_url)]
    pools = [pool, AsyncConnectionPool(outbox_db_url, kwargs={"autocommit": True}, open=False)]
    await pools[1].open()
    enqueuers = [
        make_enqueuer(p, c, listen=outbox_db_url, poll_interval=0.2)
        for p, c in zip(pools, clients, strict=True)
    ]
    async with running(enqueuers[0]), running(enqueuers[1]):
        await eventually(lambda: _true(outbox_status(outbox_db_url) == {}), within=60)

    entries = await published(clients[0], queue)
    assert sorted(e["outbox_id"] for e in entries) == sorted(ids)
    await pools[1].close()
    for c in clients:
        await c.aclose()


async def test_redis_down_means_retry_with_growing_backoff_then_publish(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_process: RedisProcess, queue: str
) -> None:
    ids = insert_rows(outbox_db_url, 20, queue=queue, backoff=1, max_retries=10)
    client = connect_redis(redis_process.url, socket_timeout=1)
    enqueuer = make_enqueuer(pool, client, publish_timeout=2)
    redis_process.stop()

    ceilings = []
    for attempt in (1, 2, 3):
        assert await enqueuer.process_batch() == 20
        delays = _retry_delays(outbox_db_url)
        assert set(delays) == {attempt}, "every row counted one more failed attempt"
        ceiling = 1 + 1 * 2 ** (attempt - 1)  # full jitter in [base, base + base*2^(n-1)]
        assert all(1 <= d <= ceiling + 0.5 for d in delays[attempt])
        ceilings.append(max(delays[attempt]))
        _make_due(outbox_db_url)
    assert outbox_status(outbox_db_url) == {"RETRY": 20}
    # Delays grow: the longest of 20 draws at attempt n beats attempt n-1's ceiling
    # (each fails to with probability 2^-20).
    assert ceilings[1] > 2
    assert ceilings[2] > 3

    redis_process.start()
    assert await enqueuer.process_batch() == 20
    assert sorted(e["outbox_id"] for e in await published(client, queue)) == sorted(ids)
    assert outbox_status(outbox_db_url) == {}
    await client.aclose()


async def test_a_row_that_always_fails_lands_in_the_dlq(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)  # the row is published to shard 0
    (row_id,) = insert_rows(outbox_db_url, 1, queue=queue, max_retries=2, backoff=1)
    await redis_standalone.set(task_stream(queue, 0), "a string, not a stream")  # WRONGTYPE
    enqueuer = make_enqueuer(pool, redis_standalone)

    for _ in range(3):
        await enqueuer.process_batch()
        _make_due(outbox_db_url)

    assert outbox_status(outbox_db_url) == {"DLQ": 1}
    with psycopg.connect(outbox_db_url) as conn:
        dlq = conn.execute("SELECT id, attempts, last_error FROM outbox_dlq").fetchall()
    assert [(r[0], r[1]) for r in dlq] == [(row_id, 3)]
    assert "WRONGTYPE" in dlq[0][2]


def _insert_payloads(url: str, stream: str, rows: list[tuple[str, str | None]]) -> None:
    """Rows as another writer inserts them: an id and a raw payload, nothing else."""
    with psycopg.connect(url) as conn:
        for row_id, payload in rows:
            conn.execute(
                "INSERT INTO outbox (id, stream, payload) VALUES (%s, %s, %s::jsonb)",
                (row_id, stream, payload),
            )


async def test_non_object_payloads_are_published_per_contract(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    stream = task_stream(queue, 0)
    _insert_payloads(outbox_db_url, stream, [("arr", "[1, 2]"), ("str", '"hello"'), ("nul", None)])
    assert await make_enqueuer(pool, redis_standalone).process_batch() == 3
    entries = {f["outbox_id"]: f for _id, f in await redis_standalone.xrange(stream)}
    assert entries["arr"] == {"data": "[1, 2]", "outbox_id": "arr"}
    assert entries["str"] == {"data": '"hello"', "outbox_id": "str"}
    assert entries["nul"] == {"id": "nul", "outbox_id": "nul"}


async def test_a_row_whose_payload_has_its_own_outbox_id_is_refused_not_overwritten(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    stream = task_stream(queue, 0)
    _insert_payloads(
        outbox_db_url, stream, [("own", '{"outbox_id": "mine", "a": 1}'), ("ok", '{"a": 1}')]
    )
    await make_enqueuer(pool, redis_standalone).process_batch()
    assert [f for _id, f in await redis_standalone.xrange(stream)] == [
        {"a": "1", "outbox_id": "ok"}
    ]
    with psycopg.connect(outbox_db_url) as conn:
        kept = conn.execute("SELECT id, status, payload, last_error FROM outbox").fetchall()
    assert [(r[0], r[1], r[2]) for r in kept] == [("own", "RETRY", {"outbox_id": "mine", "a": 1})]
    assert "payload key 'outbox_id' is reserved" in kept[0][3]


async def test_listener_reconnects_after_its_backend_is_killed(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    enqueuer = make_enqueuer(pool, redis_standalone, listen=outbox_db_url, poll_interval=60)
    assert enqueuer.listener is not None
    listener = enqueuer.listener
    async with running(enqueuer):
        await eventually(lambda: _true(listener.connected))
        with psycopg.connect(outbox_db_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'outbox-dispatcher-listener'"
                " AND datname = current_database()"
            ).fetchall()
            assert killed == [(True,)]
        await eventually(lambda: _true(not listener.connected))
        # Committed while nobody listens; the poll is 60 s away.
        insert_rows(outbox_db_url, 5, queue=queue)
        await eventually(lambda: _has_entries(redis_standalone, queue, 5), within=20)
        # The claims that stand in for NOTIFY while nobody listens may publish them first.
        await eventually(lambda: _true(listener.connects >= 2))


def _retry_delays(url: str) -> dict[int, list[float]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT attempt_count, extract(epoch FROM next_attempt_at - updated_at)::float8 "
            "FROM outbox WHERE status = 'RETRY'"
        ).fetchall()
    out: dict[int, list[float]] = {}
    for attempt, delay in rows:
        out.setdefault(attempt, []).append(delay)
    return out


def _make_due(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET next_attempt_at = now() WHERE status = 'RETRY'")


async def _true(value: object) -> bool:
    return bool(value)


async def _has_entries(client: RedisClient, queue: str, n: int) -> bool:
    return len(await published(client, queue)) >= n


async def test_each_enqueuer_counts_in_the_registry_it_is_given(
    pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str, outbox_db_url: str
) -> None:
    """Two enqueuers in one process keep their own metrics; the process registry gets none."""
    insert_rows(outbox_db_url, 20, queue=queue)
    mine, other = CollectorRegistry(), CollectorRegistry()
    working = make_enqueuer(pool, redis_standalone, registry=mine, poll_interval=0.05)
    make_enqueuer(pool, redis_standalone, registry=other)  # the same metric names, never run
    processed = "dispatcher_outbox_processed_total"

    async def counted() -> bool:
        return mine.get_sample_value(processed, {"queue": queue}) == 20

    async with running(working):
        await eventually(counted)
    assert mine.get_sample_value("dispatcher_outbox_batches_total")
    assert other.get_sample_value(processed, {"queue": queue}) is None
    assert REGISTRY.get_sample_value(processed, {"queue": queue}) is None


async def test_a_backlog_is_claimed_in_the_settlement_of_the_batch_before(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """One run: each full batch that published whole claims the next as it settles."""
    ids = insert_rows(outbox_db_url, 35, queue=queue)
    enqueuer = make_enqueuer(pool, redis_standalone, batch_size=10)
    published_whole: list[tuple[int, bool]] = []
    async with enqueuer.pipeline.claimed() as run:
        while len(run):
            await run.publish()
            published_whole.append((len(run), run.whole))
            if not run.whole:
                await run.settle()
                break
            assert await run.settle_and_claim_next()
    assert published_whole == [(10, True), (10, True), (10, True), (5, False)]
    assert sorted(e["outbox_id"] for e in await published(redis_standalone, queue)) == sorted(ids)
    assert outbox_status(outbox_db_url) == {}
    with psycopg.connect(outbox_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_batches").fetchone() == (0,)


async def test_a_slot_stops_chaining_claims_once_the_enqueuer_is_stopping(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    insert_rows(outbox_db_url, 35, queue=queue)
    stopping = make_enqueuer(pool, redis_standalone, batch_size=10)
    stopping.request_stop()
    assert await stopping.slots.batch_in_slot(acquire=True) == 10
    assert outbox_status(outbox_db_url) == {"PENDING": 25}, "one batch, then the loop decides"
    chained = make_enqueuer(pool, redis_standalone, batch_size=10)
    assert await chained.slots.batch_in_slot(acquire=True) == 5, "the last batch of the chain"
    assert outbox_status(outbox_db_url) == {}
    assert len(await published(redis_standalone, queue)) == 35


async def test_a_hint_before_the_loop_runs_starts_no_batch(
    outbox_db_url: str, pool: AsyncConnectionPool[Any], redis_standalone: RedisClient, queue: str
) -> None:
    """The first maintenance pass settles the journal a crash left before anything is claimed:
    a hint that comes earlier (the listener starts first) only rings the loop."""
    insert_rows(outbox_db_url, 3, queue=queue)
    enqueuer = make_enqueuer(pool, redis_standalone)
    # Redis's room read (as the loop does each turn): only the loop not running holds it back.
    assert await enqueuer.memory.allows()
    assert await enqueuer.durability.allows()
    enqueuer.hints.receive("")
    assert enqueuer.slots.running == set()
    enqueuer.slots.open()  # what the loop does when it starts
    enqueuer.hints.receive("")
    (batch,) = enqueuer.slots.running
    assert await batch == 3
