"""``dispatcher migrate`` and ``dispatcher enqueuer``: CLI glue for the outbox."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from dispatcher.cli.main import Common, UsageError, number
from dispatcher.config import Settings
from dispatcher.lifecycle import run_until_signalled
from dispatcher.observability import ObservabilityServer
from dispatcher.outbox.enqueuer import EnqueuerConfig, OutboxEnqueuer
from dispatcher.outbox.pooler import require_session_pooling
from dispatcher.outbox.repository import ENQUEUER_SESSION, OutboxRepository, enqueuer_pool
from dispatcher.outbox.schema import migrate
from dispatcher.redis_client import check_eviction_policy, connect_redis
from dispatcher.stream.publisher import RedisStreamPublisher
from dispatcher.stream.shard_count import LiveShardCount, ensure_shard_count

__all__ = ["register_enqueuer", "register_migrate"]

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
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "nothing to do"
    print(f"migrate: {names}")
    return 0


def register_enqueuer(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "enqueuer",
        help="publish committed outbox rows to Redis Streams (LISTEN/NOTIFY + poll)",
        description="Run the outbox enqueuer until SIGTERM/SIGINT: it is woken by NOTIFY "
        "outbox_new, claims due rows with FOR UPDATE SKIP LOCKED, publishes each batch in one "
        "pipelined round trip, deletes what was published and retries the rest with backoff.",
    )
    g = p.add_argument_group("enqueuer")
    g.add_argument(
        "--batch-size",
        type=number(int, 1),
        default=EnqueuerConfig().batch_size,
        help="rows per claim (one transaction)",
    )
    g.add_argument("--concurrency", type=number(int, 1), default=4, help="batches at once")
    g.add_argument(
        "--poll-interval", type=number(float, 0.01), default=1.0, help="seconds between polls"
    )
    g.add_argument(
        "--shards",
        type=number(int, 1),
        help="shard count written to composer:stream_shards only if it is absent (first start; "
        "env STREAM_SHARDS); change it later with `dispatcher shards set`",
    )
    g.add_argument(
        "--recover-in-flight-after",
        type=number(float, 1),
        default=30.0,
        help="seconds a batch may hang before PostgreSQL ends its transaction and its rows "
        "are due again (must exceed --publish-timeout)",
    )
    g.add_argument(
        "--maintenance-interval",
        type=number(float, 0.1),
        default=30.0,
        help="seconds between runs that count the attempts of batches that never settled",
    )
    g.add_argument(
        "--wait-replicas",
        type=number(int, 0),
        default=0,
        help="Redis replicas that must acknowledge a batch (WAIT) before its rows are deleted",
    )
    g.add_argument(
        "--publish-timeout", type=number(float, 0.1), default=10.0, help="seconds per batch"
    )
    g.add_argument(
        "--shutdown-timeout",
        type=number(float, 0),
        default=30.0,
        help="seconds to finish in-flight batches after SIGTERM",
    )
    g.add_argument(
        "--redis-memory-high",
        type=number(float, 0),
        default=EnqueuerConfig().redis_memory_high,
        help="share of Redis maxmemory at which claims pause and rows wait in the outbox "
        "(no attempt counted); 0 = never pause (default %(default)s)",
    )
    g.add_argument(
        "--redis-memory-low",
        type=number(float, 0),
        default=EnqueuerConfig().redis_memory_low,
        help="share of Redis maxmemory below which paused claims resume (default %(default)s)",
    )
    g.add_argument(
        "--vacuum-threshold",
        type=number(int, 0),
        default=EnqueuerConfig().vacuum_threshold,
        help="dead tuples in the outbox past which maintenance vacuums it when nothing else "
        "has for a minute (autovacuum off or starved); 0 = leave it to autovacuum "
        "(default %(default)s)",
    )
    g.add_argument("--metrics-port", type=number(int, 0), help="env METRICS_PORT; 0 = off")
    g.add_argument("--no-listen", action="store_true", help="poll only, no LISTEN connection")
    common(p)
    p.set_defaults(handler=_enqueuer)


def _config(args: argparse.Namespace) -> EnqueuerConfig:
    try:
        return EnqueuerConfig(
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            poll_interval=args.poll_interval,
            recover_in_flight_after=args.recover_in_flight_after,
            maintenance_interval=args.maintenance_interval,
            wait_replicas=args.wait_replicas,
            publish_timeout=args.publish_timeout,
            shutdown_timeout=args.shutdown_timeout,
            redis_memory_high=args.redis_memory_high,
            redis_memory_low=args.redis_memory_low,
            vacuum_threshold=args.vacuum_threshold,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _enqueuer(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(args)
    dsn = settings.require_database_url()
    await require_session_pooling(dsn, options=ENQUEUER_SESSION)
    redis = connect_redis(settings.redis_url.get_secret_value(), cluster=settings.redis_cluster)
    pool = enqueuer_pool(dsn, max_size=config.concurrency + 2)
    try:
        await pool.open(wait=True, timeout=15)
        await check_eviction_policy(redis)
        if await ensure_shard_count(redis, settings.stream_shards):
            log.info("composer:stream_shards was absent; set it to %d", settings.stream_shards)
        enqueuer = OutboxEnqueuer(
            repository=OutboxRepository(pool),
            publisher=RedisStreamPublisher(redis, group="workers"),
            config=config,
            listen_conninfo=None if args.no_listen else dsn,
            shard_count=LiveShardCount(redis, fallback=settings.stream_shards),
        )
        server = ObservabilityServer(
            port=settings.metrics_port,
            live=enqueuer.live,
            ready=enqueuer.ready,
        )
        await server.start()
        try:
            await run_until_signalled(enqueuer.run, enqueuer.request_stop)
        finally:
            await server.stop()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.close(), 5)
        await redis.aclose()
    return 0
