"""``dispatcher worker``: CLI glue from flags and settings to a ``Worker``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from prometheus_client import REGISTRY

from dispatcher.cli.main import Common, UsageError, number
from dispatcher.config import Settings
from dispatcher.lifecycle import run_until_signalled
from dispatcher.observability import ObservabilityServer
from dispatcher.redis_client import check_eviction_policy, connect_redis
from dispatcher.worker import (
    Handler,
    HandlerImportError,
    Worker,
    WorkerConfig,
    default_consumer_name,
    load_handler,
)

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "worker",
        help="consume a queue's shard streams and run a handler for each task",
        description="Run a worker until SIGTERM/SIGINT: read every shard stream of the queues "
        "through a consumer group, run the handler (sync in a thread, or async), ack on "
        "success, reclaim idle entries, dead-letter poison messages to workflow.dead.<queue>.",
    )
    g = p.add_argument_group("worker")
    seconds = number(float)  # finite: nan/inf would spin or disable a timer
    g.add_argument("--queue", action="append", required=True, help="queue to read (repeatable)")
    g.add_argument(
        "--handler",
        required=True,
        dest="handler_path",  # ``handler`` is the subcommand's entry point in main
        help="the handler, as module:function",
    )
    g.add_argument("--concurrency", type=int, default=8, help="handlers at once (8)")
    g.add_argument("--group", default="workers", help="consumer group (workers)")
    g.add_argument("--consumer", default=None, help="consumer name (hostname-pid)")
    g.add_argument(
        "--max-runs",
        "--max-deliveries",
        dest="max_runs",
        type=int,
        default=5,
        help="handler runs of one task attempt, then dead-letter (5); --max-deliveries is "
        "its old name, same meaning",
    )
    g.add_argument(
        "--reclaim-idle", type=seconds, default=30.0, help="seconds before reclaiming an entry (30)"
    )
    g.add_argument("--shards", type=int, default=None, help="shards if the key is unset (env)")
    g.add_argument("--metrics-port", type=int, default=None, help="env METRICS_PORT; 0 = off")
    g.add_argument("--grace-period", type=seconds, default=30.0, help="seconds on stop (30)")
    g.add_argument("--lease-ttl", type=seconds, default=30.0, help="attempt lease seconds (30)")
    g.add_argument(
        "--handler-timeout",
        type=seconds,
        default=0.0,
        help="seconds a run may take, then it counts as failed (0 = no limit)",
    )
    g.add_argument(
        "--dedup-window", type=seconds, default=86400.0, help="seconds a done attempt is remembered"
    )
    common(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> Any:
    """Validate everything a user can get wrong before touching Redis."""
    handler = _handler(args.handler_path)
    try:
        config = WorkerConfig(
            queues=tuple(dict.fromkeys(args.queue)),
            group=args.group,
            consumer=args.consumer or default_consumer_name(),
            concurrency=args.concurrency,
            max_runs=args.max_runs,
            reclaim_idle=args.reclaim_idle,
            lease_ttl=args.lease_ttl,
            handler_timeout=args.handler_timeout,
            dedup_window=args.dedup_window,
            shards=settings.stream_shards,
            grace_period=args.grace_period,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _serve(settings, handler, config)


def _handler(path: str) -> Handler:
    # Like ``python -m``, find handler modules relative to the working directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_handler(path)
    except HandlerImportError as exc:
        raise UsageError(str(exc)) from None


async def _serve(settings: Settings, handler: Handler, config: WorkerConfig) -> int:
    client = connect_redis(settings.redis_url.get_secret_value(), cluster=settings.redis_cluster)
    try:
        await client.ping()
        await check_eviction_policy(client)
        worker = Worker(client, handler, config, registry=REGISTRY)
        server = ObservabilityServer(
            port=settings.metrics_port, live=worker.live, ready=worker.ready
        )
        await server.start()
        try:
            await run_until_signalled(worker.run, worker.request_stop)
        finally:
            if worker.abandoned:
                _exit_now(worker.abandoned)
            await server.stop()
    finally:
        await client.aclose()
    return 0


def _exit_now(threads: int) -> None:
    """End the process without waiting for handler threads that outlived the grace period.

    The interpreter would join them at exit while their leases lapse, and
    another worker would run the same attempt beside them; ending now keeps
    the leases until the process is gone (they then expire, and the attempt
    runs again as a run whose worker died).
    """
    log.warning("exiting without waiting for %d handler threads", threads)
    logging.shutdown()
    os._exit(0)
