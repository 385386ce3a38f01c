"""``dispatcher console``: serve the web console (``dispatcher.console``) until SIGTERM."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dispatcher.cli.flags import add_options, number
from dispatcher.cli.main import Common
from dispatcher.cli.ops import REPORT_GROUP
from dispatcher.config import STREAM_SHARDS, Settings

__all__ = ["TOKEN_ENV", "register"]

TOKEN_ENV = "DISPATCHER_CONSOLE_TOKEN"


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "console",
        help="serve a web page over every queue, dead letter and limit, with actions",
        description="Serve the console: queues and their shards, workers, the outbox, dead "
        "letters, limits and a run's tasks, live; replay/delete dead letters, set limits, "
        "cancel a run, change the shard count. Read-only unless a token is given: actions "
        f"need a signed-in session (the token, from --token or {TOKEN_ENV}).",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port", type=number(int, 1), default=8080, help="port to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"the token that allows actions (prefer the env {TOKEN_ENV}: a flag shows in ps); "
        "without one the console is read-only",
    )
    p.add_argument(
        "--refresh",
        type=number(float, 0.5),
        default=2.0,
        help="seconds between samples the page shows (default: %(default)g)",
    )
    p.add_argument(
        "--discover-every",
        type=number(float, 1),
        default=60.0,
        help="seconds between scans for new streams (SCANs: default %(default)g)",
    )
    add_options(p, [REPORT_GROUP, STREAM_SHARDS])
    common(p)
    p.set_defaults(handler=_console)


async def _console(args: argparse.Namespace, settings: Settings) -> int:
    from dispatcher.console import ConsoleConfig, serve

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    await serve(
        ConsoleConfig(
            database_url=settings.require_database_url(),
            redis_url=settings.redis_url.get_secret_value(),
            redis_cluster=settings.redis_cluster,
            host=args.host,
            port=args.port,
            token=token,
            group=args.group,
            fallback_shards=settings.stream_shards,
            refresh=args.refresh,
            discover_every=args.discover_every,
        )
    )
    return 0
