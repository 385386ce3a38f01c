"""``dispatcher cancel --run R``: cancel a run in a transaction of its own.

The same statement as ``cancel_run`` (``dispatcher.outbox.run_cancel``), committed
at once: the run's rows still in the outbox are deleted, and an enqueuer
records the cancel in Redis for the workers.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

from dispatcher.cli.main import Common, UsageError
from dispatcher.config import Settings
from dispatcher.outbox.run_cancel import InvalidRunId, cancel_run_now

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "cancel",
        help="cancel a run: its tasks not published yet are dropped, workers start none of it",
        description="Cancel every task of a run (by run_id), in a transaction of its own. "
        "Rows still in the outbox are deleted; an enqueuer records the cancel in Redis, where "
        "workers ack the run's entries without running them (for the dedup window) and cancel "
        "its async handlers that run. See docs/guarantees.md.",
    )
    p.add_argument("--run", required=True, metavar="R", help="the run_id to cancel")
    common(p)
    p.set_defaults(handler=_cancel)


async def _cancel(args: argparse.Namespace, settings: Settings) -> int:
    async with await psycopg.AsyncConnection.connect(settings.require_database_url()) as conn:
        try:
            removed = await cancel_run_now(conn, args.run)
        except InvalidRunId as exc:
            raise UsageError(f"--run: {exc}") from None
    print(f"cancel: run {args.run!r} cancelled; {removed} outbox rows removed")
    return 0
