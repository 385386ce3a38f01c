"""``dispatcher status`` and ``dispatcher dlq``: the day-to-day operations commands."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from dispatcher.cli.flags import add_options
from dispatcher.cli.main import Common, UsageError
from dispatcher.config import Settings
from dispatcher.options import option_of
from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient, connect_redis, first_answer
from dispatcher.replay import (
    ReplayError,
    delete_dead_letters,
    delete_outbox_dlq,
    replay_dead_stream,
    replay_outbox_dlq,
)
from dispatcher.status import gather_status, render_text
from dispatcher.stream.naming import InvalidQueueName, dead_letter_stream, validate_queue
from dispatcher.stream.shard_count import read_shard_count
from dispatcher.worker.worker_config import WorkerConfig

__all__ = ["REPORT_GROUP", "redis_client", "register_dlq", "register_status"]


@contextlib.asynccontextmanager
async def redis_client(settings: Settings) -> AsyncIterator[RedisClient]:
    client = connect_redis(settings.redis_url.get_secret_value(), cluster=settings.redis_cluster)
    try:
        await first_answer(client)  # a silent server: one line after the connect timeout
        yield client
    finally:
        await client.aclose()


# The consumer group whose pending entries and lag `status` and `shards` report.
REPORT_GROUP = dataclasses.replace(
    option_of(WorkerConfig, "group"), help="the consumer group whose pending entries count"
)


def register_status(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "status",
        help="outbox rows by status, DLQ size, and every task stream's length/pending/lag",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_options(p, [REPORT_GROUP])
    common(p)
    p.set_defaults(handler=_status)


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    dsn = settings.require_database_url()
    # One plain connection first: a server that is down fails it at once, with its cause (a
    # pool would retry for its whole timeout, logging each try, and then drop the cause).
    await (await psycopg.AsyncConnection.connect(dsn)).close()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        open=False,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=True, timeout=10)
    try:
        async with redis_client(settings) as redis:
            report = await gather_status(pool=pool, redis=redis, group=args.group)
    finally:
        await pool.close()
    print(json.dumps(report.to_json(), indent=2) if args.json else render_text(report))
    return 0


def register_dlq(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "dlq",
        help="list or replay dead letters (outbox_dlq, or a queue's workflow.dead stream)",
        description="Without --queue these act on outbox_dlq (rows the enqueuer could not "
        "publish); with --queue Q on workflow.dead.Q (tasks workers gave up on).",
    )
    dlq = p.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    lst = dlq.add_parser("list", help="show dead letters, newest first")
    lst.add_argument("--limit", type=int, default=50, help="rows to show (default: %(default)s)")
    lst.add_argument("--queue", help="list workflow.dead.<queue> instead of outbox_dlq")
    common(lst)
    lst.set_defaults(handler=_dlq_list)
    rep = dlq.add_parser("replay", help="send dead letters back to be dispatched again")
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", dest="ids", help="an id to replay (repeatable)")
    which.add_argument("--all", action="store_true", help="replay every dead letter")
    rep.add_argument("--dry-run", action="store_true", help="show what would be replayed")
    rep.add_argument("--queue", help="replay workflow.dead.<queue> instead of outbox_dlq")
    common(rep)
    rep.set_defaults(handler=_dlq_replay)
    rm = dlq.add_parser("delete", help="delete dead letters for good (all or none of the ids)")
    which = rm.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", dest="ids", help="an id to delete (repeatable)")
    which.add_argument("--all", action="store_true", help="delete every dead letter")
    rm.add_argument("--queue", help="delete from workflow.dead.<queue> instead of outbox_dlq")
    common(rm)
    rm.set_defaults(handler=_dlq_delete)


def _queue(args: argparse.Namespace) -> str | None:
    if args.queue is None:
        return None
    try:
        return validate_queue(args.queue)
    except InvalidQueueName as exc:
        raise UsageError(str(exc)) from None


async def _dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    queue = _queue(args)
    if queue is not None:
        async with redis_client(settings) as redis:
            entries: list[Any] = await redis.xrevrange(dead_letter_stream(queue), count=args.limit)  # type: ignore[assignment]
        for entry_id, fields in entries:
            task, runs = fields.get("task_id", "?"), fields.get("runs", "?")
            count = fields.get("delivery_count", "?")
            print(
                f"{entry_id}  task={task}  runs={runs}  deliveries={count}  "
                f"error={fields.get('error', '')}"
            )
        print(f"({len(entries)} shown)")
        return 0
    async with await psycopg.AsyncConnection.connect(settings.require_database_url()) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(QUERIES["dlq_list"], {"limit": args.limit})
        rows = await cur.fetchall()
    for r in rows:
        print(
            f"{r['id']}  task={r['task_id']}  stream={r['stream']}  attempts={r['attempts']}  "
            f"moved={r['moved_at']:%Y-%m-%d %H:%M:%S}  error={r['last_error']}"
        )
    print(f"({len(rows)} shown)")
    return 0


async def _dlq_replay(args: argparse.Namespace, settings: Settings) -> int:
    queue = _queue(args)
    try:
        if queue is not None:
            async with redis_client(settings) as redis:
                shards = await read_shard_count(redis, fallback=settings.stream_shards)
                done = await replay_dead_stream(
                    redis,
                    queue,
                    ids=args.ids or (),
                    all_entries=args.all,
                    shards=shards,
                    dry_run=args.dry_run,
                )
        else:
            async with await psycopg.AsyncConnection.connect(
                settings.require_database_url()
            ) as conn:
                done = await replay_outbox_dlq(
                    conn, ids=args.ids or (), all_rows=args.all, dry_run=args.dry_run
                )
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    verb = "would replay" if done.dry_run else "replayed"
    print(f"{verb} {len(done.ids)}: {' '.join(done.ids)}".rstrip(": "))
    return 0


async def _dlq_delete(args: argparse.Namespace, settings: Settings) -> int:
    queue = _queue(args)
    try:
        if queue is not None:
            async with redis_client(settings) as redis:
                done = await delete_dead_letters(
                    redis, queue, ids=args.ids or (), all_entries=args.all
                )
        else:
            async with await psycopg.AsyncConnection.connect(
                settings.require_database_url()
            ) as conn:
                done = await delete_outbox_dlq(conn, ids=args.ids or (), all_rows=args.all)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    print(f"deleted {len(done.ids)}: {' '.join(done.ids)}".rstrip(": "))
    return 0
