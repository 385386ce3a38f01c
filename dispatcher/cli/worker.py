"""``dispatcher worker``: CLI glue from flags and settings to a ``Worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from prometheus_client import REGISTRY

from dispatcher.cli.flags import add_options, option_values
from dispatcher.cli.main import Common, UsageError
from dispatcher.config import CONNECT_TIMEOUT, METRICS_PORT, REQUIRE_AOF, STREAM_SHARDS, Settings
from dispatcher.options import Option, options
from dispatcher.redis_client import (
    check_eviction_policy,
    check_persistence,
    connect_redis,
    first_answer,
)
from dispatcher.startup import run_when_up
from dispatcher.worker import (
    Handler,
    HandlerImportError,
    Worker,
    WorkerConfig,
    default_consumer_name,
    load_handler,
)

__all__ = ["WORKER_OPTIONS", "register"]

log = logging.getLogger(__name__)


QUEUE = Option(
    name="queue",
    kind=str,
    default=None,
    required=True,
    repeat=True,
    help="queue to read (repeatable)",
)
HANDLER = Option(
    # ``handler`` is the subcommand's entry point in main.
    name="handler_path",
    flag="--handler",
    kind=str,
    default=None,
    required=True,
    help="the handler, as module:function",
)
CONSUMER = Option(
    name="consumer",
    kind=str,
    default=None,
    shown="hostname-pid",
    help="consumer name, unique per process",
)
# Every flag of `dispatcher worker`, in --help order.
WORKER_OPTIONS = (
    QUEUE,
    HANDLER,
    *options(WorkerConfig).values(),
    CONSUMER,
    STREAM_SHARDS,
    METRICS_PORT,
    REQUIRE_AOF,
)


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "worker",
        help="consume a queue's shard streams and run a handler for each task",
        description="Run a worker until SIGTERM/SIGINT: read every shard stream of the queues "
        "through a consumer group, run the handler (sync in a thread, or async), ack on "
        "success, reclaim idle entries, dead-letter poison messages to workflow.dead.<queue>.",
    )
    add_options(p.add_argument_group("worker"), WORKER_OPTIONS)
    common(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> Any:
    """Validate everything a user can get wrong before touching Redis."""
    handler = _handler(args.handler_path)
    try:
        config = WorkerConfig(
            queues=tuple(dict.fromkeys(args.queue)),
            consumer=args.consumer or default_consumer_name(),
            shards=settings.stream_shards,
            **option_values(args, WorkerConfig),
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
        raise UsageError(str(exc)) from exc


async def _serve(settings: Settings, handler: Handler, config: WorkerConfig) -> int:
    client = connect_redis(settings.redis_url.get_secret_value(), cluster=settings.redis_cluster)

    async def start() -> Worker:
        # The client's sockets have no read timeout (XREADGROUP blocks on them): bound the
        # start-up round trips here, so a Redis that accepts and never answers fails them.
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await first_answer(client)
            await check_eviction_policy(client)
            await check_persistence(client, require=settings.require_aof)
        return Worker(client, handler, config, registry=REGISTRY)

    try:
        worker = await run_when_up(
            start, what="connecting to Redis", metrics_port=settings.metrics_port
        )
        if worker is not None and (worker.cut_short or worker.abandoned):
            _exit_now(worker)
    finally:
        await client.aclose()
    return 0


def _exit_now(worker: Worker) -> None:
    """End the process without waiting for threads that outlived the grace period.

    A sync handler's thread, or one an async handler waited for, cannot be
    stopped: the interpreter (and ``asyncio.run``) would join them at exit
    while their leases lapse, and another worker would run the same attempt
    beside them; ending now keeps the leases until the process is gone (they
    then expire, and the attempt runs again as a run whose worker died).
    """
    log.warning(
        "exiting now, without waiting for the threads of runs the grace period cut short "
        "(%d sync handler threads still running; runs cut short: %s)",
        worker.abandoned,
        ", ".join(worker.cut_short) or "none",
    )
    logging.shutdown()
    os._exit(0)
