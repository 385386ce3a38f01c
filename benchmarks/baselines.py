"""Baselines the product is measured against, in the same run.

- ``PerRowPublisher``: one awaited XADD per row, as the spec design's
  ``publishRow`` loop does.
- The spec design's own table (``SPEC_SCHEMA``, created in schema ``spec`` of
  the benchmark database) and its claim (``SPEC_CLAIM``: UPDATE to IN_FLIGHT,
  then DELETE of the published rows), run with no Redis at all (the SQL-only
  cycle) and as the straightforward relay (per-row XADD in between).
- The pipelined reference relay (``relay``; ``python -m benchmarks.baselines``
  runs it as its own process): a minimal naive relay on the project's table.
  LISTEN; on a notification (or every second) claim due rows with one query,
  publish them in one pipelined XADD batch, delete them, commit. No idle flag,
  no retries, no WAIT: what any team would write first, so the enqueuer's
  figures say what its guarantees and its idle path cost or save.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from redis.exceptions import RedisError

from dispatcher.models import payload_fields
from dispatcher.outbox import EnqueuerConfig
from dispatcher.redis_client import RedisClient, connect_redis
from dispatcher.stream import (
    SHARDS_KEY,
    Fields,
    PublishResult,
    RedisStreamPublisher,
    parse_shard_count,
    route_stream,
)
from dispatcher.stream.naming import WORKER_GROUP

# The spec design's "Step 3" table and indexes, verbatim but for the schema.
SPEC_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS spec;
CREATE TABLE IF NOT EXISTS spec.outbox(
    id TEXT PRIMARY KEY,
    task_id TEXT,
    stream TEXT NOT NULL,
    payload JSONB,
    type TEXT,
    status TEXT NOT NULL DEFAULT 'PENDING',
    attempt_count INT NOT NULL DEFAULT 0,
    max_retries INT NOT NULL DEFAULT 5,
    next_attempt_at TIMESTAMPTZ,
    last_error TEXT,
    backoff_seconds INT NOT NULL DEFAULT 5,
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    sent_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS idx_outbox_status ON spec.outbox(status, created_at);
CREATE INDEX IF NOT EXISTS idx_outbox_pending_next
    ON spec.outbox (created_at)
    WHERE status IN ('PENDING', 'RETRY');
CREATE INDEX IF NOT EXISTS idx_outbox_task_id ON spec.outbox (task_id) WHERE task_id IS NOT NULL;
"""

# The spec design's processBatch claim, verbatim but for reading the payload as text.
SPEC_CLAIM = """
UPDATE outbox SET status = 'IN_FLIGHT', updated_at = NOW()
 WHERE id IN (
       SELECT id FROM outbox
        WHERE status IN ('PENDING', 'RETRY')
          AND (next_attempt_at IS NULL OR next_attempt_at <= NOW())
        ORDER BY created_at
        LIMIT %s
          FOR UPDATE SKIP LOCKED)
RETURNING id, stream, payload::text, attempt_count, max_retries, next_attempt_at, backoff_seconds
"""


def spec_schema_url(db_url: str) -> str:
    """``db_url`` with the spec design's table first on the search path (created if missing)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SPEC_SCHEMA)
    return psycopg.conninfo.make_conninfo(db_url, options="-c search_path=spec")


class PerRowPublisher(RedisStreamPublisher):
    async def publish_many(
        self,
        entries: Sequence[tuple[str, Fields]],
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> list[PublishResult]:
        results = []
        for stream, fields in entries:
            try:
                results.append(PublishResult(stream, entry_id=await self.publish(stream, fields)))
            except RedisError as exc:
                results.append(PublishResult(stream, error=exc))
        return results

    async def publish(self, stream: str, fields: Fields) -> str:
        await self._ensure_groups([stream])
        return str(await self.client.xadd(stream, dict(fields)))  # type: ignore[arg-type]


Publish = Callable[[list[tuple[Any, ...]]], Awaitable[None]]


async def spec_cycle(
    db_url: str,
    rows: int,
    publish: Publish | None,
    *,
    done: Callable[[], None] | None = None,
    batch: int | None = None,
) -> float:
    """Rows/s of loops of: spec claim, ``publish`` (if any), DELETE.

    ``done`` is called when the rows are gone, while the connections (and so their
    PostgreSQL backends, whose CPU time a caller may read) are still open.

    Batch size (unless ``batch``) and loop count are the enqueuer's defaults, so the
    comparison is always at the same batch size and connection count.
    """
    defaults = EnqueuerConfig()
    batch, connections = batch or defaults.batch_size, defaults.concurrency
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        db_url,
        min_size=connections,
        max_size=connections,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open(wait=True)

    async def loop() -> None:
        while True:
            async with pool.connection() as conn:
                claimed = await (await conn.execute(SPEC_CLAIM, (batch,))).fetchall()
                if not claimed:
                    return
                if publish:
                    await publish(claimed)
                await conn.execute(
                    "DELETE FROM outbox WHERE id = ANY(%s)", ([r[0] for r in claimed],)
                )

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(connections)))
    elapsed = time.perf_counter() - started
    if done:
        done()
    await pool.close()
    return rows / elapsed


def per_row_relay(redis_url: str) -> tuple[Publish, Callable[[], Awaitable[None]]]:
    """The spec design's publishRow loop: one awaited XADD per claimed row."""
    publisher = PerRowPublisher(connect_redis(redis_url), group=WORKER_GROUP)

    async def publish(claimed: list[tuple[Any, ...]]) -> None:
        for row_id, stream, payload, *_ in claimed:
            await publisher.publish(stream, payload_fields(payload, row_id))

    return publish, publisher.client.aclose


# The relay's claim: new rows of the project's table, oldest first, locked until commit. It
# never retries, so it reads only the partial index of rows due at once; a filter the index
# does not match makes the planner sort the whole table on every claim.
RELAY_CLAIM = """
SELECT id, task_id, stream, payload::text FROM outbox
 WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at IS NULL AND NOT suspect
 ORDER BY created_at
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
CHANNEL = "outbox_new"


async def relay_batch(conn: psycopg.AsyncConnection[Any], redis: RedisClient, *,
                      batch: int, shards: int) -> int:  # fmt: skip
    """One claim -> pipelined XADD -> DELETE -> COMMIT; the number of rows it moved."""
    async with conn.transaction():
        rows = await (await conn.execute(RELAY_CLAIM, (batch,))).fetchall()
        if not rows:
            return 0
        pipe = redis.pipeline(transaction=False)
        for row_id, task_id, stream, payload in rows:
            pipe.xadd(
                route_stream(stream, task_id or row_id, shards), payload_fields(payload, row_id)
            )  # type: ignore[arg-type]
        await pipe.execute()
        await conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", ([r[0] for r in rows],))
    return len(rows)


async def relay(db_url: str, redis_url: str, *, batch: int, concurrency: int,
                listen: bool = True) -> None:  # fmt: skip
    """Run the pipelined reference relay until cancelled."""
    redis = connect_redis(redis_url)
    shards = parse_shard_count(await redis.get(SHARDS_KEY) or "4")
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True)
             for _ in range(concurrency)]  # fmt: skip
    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)

    async def drain_with(conn: psycopg.AsyncConnection[Any]) -> None:
        while await relay_batch(conn, redis, batch=batch, shards=shards) == batch:
            pass

    async def drain() -> None:
        # One claim first (the idle case); a full batch means a backlog: all loops then.
        if await relay_batch(conns[0], redis, batch=batch, shards=shards) == batch:
            await asyncio.gather(*(drain_with(c) for c in conns))

    try:
        if listen:
            await listener.execute(f"LISTEN {CHANNEL}")
        while True:
            await drain()
            if listen:
                async for _ in listener.notifies(timeout=1.0, stop_after=1):
                    pass
            else:
                await asyncio.sleep(1.0)
    finally:
        for conn in [*conns, listener]:
            await conn.close()
        await redis.aclose()


def main() -> None:
    defaults = EnqueuerConfig()
    parser = argparse.ArgumentParser(description="the pipelined reference relay")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--no-listen", action="store_true")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(relay(args.database_url, args.redis_url, batch=args.batch_size,
                          concurrency=args.concurrency, listen=not args.no_listen))  # fmt: skip


if __name__ == "__main__":
    main()
