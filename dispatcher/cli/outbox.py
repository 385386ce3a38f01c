"""``dispatcher migrate`` and ``dispatcher enqueuer``: CLI glue for the outbox."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

import psycopg
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool

from dispatcher.cli.flags import add_options, option_values
from dispatcher.cli.main import Common, UsageError
from dispatcher.config import METRICS_PORT, REQUIRE_AOF, STREAM_SHARDS, Settings
from dispatcher.options import Option, options
from dispatcher.outbox.enqueuer import OutboxEnqueuer
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.outbox.pooler import require_session_pooling
from dispatcher.outbox.repository import ENQUEUER_SESSION, OutboxRepository, enqueuer_pool
from dispatcher.outbox.schema import migrate, require_schema
from dispatcher.redis_client import (
    check_eviction_policy,
    check_persistence,
    connect_redis,
    first_answer,
)
from dispatcher.startup import run_when_up
from dispatcher.stream.naming import WORKER_GROUP
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import ensure_shard_count

__all__ = ["ENQUEUER_OPTIONS", "register_enqueuer", "register_migrate"]

log = logging.getLogger("dispatcher.enqueuer")


def register_migrate(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "migrate",
        help="create or upgrade the outbox schema (idempotent, safe to run concurrently)",
        description="Apply the outbox schema migrations that are missing, under an advisory "
        "lock, recording each applied version in outbox_schema_version.",
    )
    common(p)
    p.set_defaults(handler=_migrate)


async def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    async with await psycopg.AsyncConnection.connect(
        settings.require_database_url(), autocommit=True
    ) as conn:
        applied = await migrate(conn)
    # Each migration was named as it was applied (INFO): here only the outcome.
    if applied:
        print(f"migrate: {len(applied)} applied, the schema is at version {applied[-1].version}")
    else:
        print("migrate: nothing to do")
    return 0


NO_LISTEN = Option(
    name="no_listen", kind=bool, default=False, help="poll only, no LISTEN connection"
)
# Every flag of `dispatcher enqueuer`, in --help order.
ENQUEUER_OPTIONS = (
    *options(EnqueuerConfig).values(),
    STREAM_SHARDS,
    METRICS_PORT,
    REQUIRE_AOF,
    NO_LISTEN,
)


def register_enqueuer(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "enqueuer",
        help="publish committed outbox rows to Redis Streams (LISTEN/NOTIFY + poll)",
        description="Run the outbox enqueuer until SIGTERM/SIGINT: it is woken by NOTIFY "
        "outbox_new, claims due rows with FOR UPDATE SKIP LOCKED, publishes each batch in one "
        "pipelined round trip, deletes what was published and retries the rest with backoff.",
    )
    add_options(p.add_argument_group("enqueuer"), ENQUEUER_OPTIONS)
    common(p)
    p.set_defaults(handler=_enqueuer)


def _config(args: argparse.Namespace) -> EnqueuerConfig:
    try:
        return EnqueuerConfig(**option_values(args, EnqueuerConfig))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _enqueuer(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(args)
    dsn = settings.require_database_url()
    # Every Redis read is bounded by the socket: a peer that stops answering (a blackholed
    # network) must fail the publish, not leave a connection (and redis-py's pool lock,
    # held while a dead connection is closed) waiting forever behind the publish timeout.
    redis = connect_redis(
        settings.redis_url.get_secret_value(),
        cluster=settings.redis_cluster,
        socket_timeout=config.publish_timeout + config.wait_timeout_ms / 1000,
    )
    pool: AsyncConnectionPool[Any] | None = None

    async def start() -> OutboxEnqueuer:
        nonlocal pool
        await require_session_pooling(dsn, options=ENQUEUER_SESSION)
        if pool is not None:  # a pool that timed out keeps trying on its own: start anew
            await _close(pool)
        pool = enqueuer_pool(dsn, max_size=config.concurrency + 2)
        await pool.open(wait=True, timeout=15)
        async with pool.connection() as conn:  # before any Redis write
            await require_schema(conn)
        await first_answer(redis)  # a silent server fails this try in the connect timeout
        await check_eviction_policy(redis)
        await check_persistence(redis, require=settings.require_aof)
        if await ensure_shard_count(redis, settings.stream_shards):
            log.info("composer:stream_shards was absent; set it to %d", settings.stream_shards)
        return OutboxEnqueuer(
            repository=OutboxRepository(pool),
            publisher=RedisStreamPublisher(redis, group=WORKER_GROUP),
            config=config,
            listen_conninfo=None if args.no_listen else dsn,
            shard_fallback=settings.stream_shards,
            registry=REGISTRY,
            require_aof=settings.require_aof,
        )

    try:
        await run_when_up(
            start, what="connecting to PostgreSQL and Redis", metrics_port=settings.metrics_port
        )
    finally:
        if pool is not None:
            await _close(pool)
        await redis.aclose()
    return 0


async def _close(pool: AsyncConnectionPool[Any]) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(pool.close(), 5)
