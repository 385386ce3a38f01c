"""``dispatcher shards`` and ``dispatcher shards set N``: see and change the shard count.

``set`` writes ``composer:stream_shards``, waits until every enqueuer and
worker has had time to read it (they refresh it every couple of seconds),
then waits until the shards beyond the new count hold no entries and no
pending entries, printing progress. Nothing is moved: the enqueuer publishes
only to the new shards at once (waiting and retried rows included), and
workers keep reading the removed shards until they are empty.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from dispatcher.cli.flags import add_options, number
from dispatcher.cli.main import Common
from dispatcher.cli.ops import REPORT_GROUP, redis_client
from dispatcher.config import Settings
from dispatcher.redis_client import RedisClient
from dispatcher.stream.discovery import ShardState, queue_shards, task_queues
from dispatcher.stream.naming import SHARDS_KEY
from dispatcher.stream.shard_count import (
    REFRESH_EVERY,
    change_shard_count,
    read_published_count,
)

__all__ = ["register"]

# Enqueuers refresh the count every REFRESH_EVERY s, workers every 2 s by default: after this
# nobody publishes by the old count and every worker reads the new shards.
SETTLE_AFTER = 2 * REFRESH_EVERY + 1.0


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "shards",
        help="show the shard count and each queue's shards; `shards set N` changes it safely",
        description="Without an action: the count in composer:stream_shards and, per queue, "
        "each shard stream's length and pending entries (shards beyond the count that still "
        "hold entries are marked draining).",
    )
    add_options(p, [REPORT_GROUP])
    common(p)
    p.set_defaults(handler=_show)
    actions = p.add_subparsers(dest="shards_command", metavar="ACTION")
    s = actions.add_parser(
        "set",
        help="change the shard count; exit 0 once it is in force and removed shards are empty",
        description="Write the new count; enqueuers publish by it within seconds (rows waiting "
        "for a retry or not_before included), workers start reading new shards and keep "
        "reading removed ones until they are empty. Exits 0 once that is done.",
    )
    s.add_argument("count", type=number(int, 1), help="the new shard count (>= 1)")
    add_options(s, [REPORT_GROUP])
    s.add_argument(
        "--refresh-wait",
        type=number(float, 0),
        default=SETTLE_AFTER,
        help="seconds for every process to read the new count (default: %(default)g)",
    )
    s.add_argument(
        "--timeout",
        type=number(float, 0),
        default=0,
        help="give up waiting for the drain after this many seconds, exit 1; 0 = wait "
        "(default: %(default)s)",
    )
    s.add_argument(
        "--no-wait", action="store_true", help="write the count and exit without waiting"
    )
    s.add_argument(
        "--progress-every",
        type=number(float, 0.1),
        default=5.0,
        help="seconds between reports (default: %(default)g)",
    )
    common(s)
    s.set_defaults(handler=_set)


async def _states(client: RedisClient, *, shards: int, group: str) -> dict[str, list[ShardState]]:
    return {
        queue: await queue_shards(client, queue, shards=shards, group=group)
        for queue in await task_queues(client)
    }


def _describe(state: ShardState) -> str:
    s = state.stats
    return f"{s.stream} (length {s.length}, pending {s.pending})"


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    async with redis_client(settings) as client:
        published, invalid = await read_published_count(client)
        if invalid is not None:
            shards = settings.stream_shards
            print(f"shard count: INVALID ({invalid}); showing STREAM_SHARDS={shards}")
        elif published is None:
            print(
                f"shard count: not set ({SHARDS_KEY} absent; the first enqueuer writes "
                f"STREAM_SHARDS={settings.stream_shards})"
            )
            shards = settings.stream_shards
        else:
            shards = published
            print(f"shard count: {shards} ({SHARDS_KEY})")
        for queue, states in (await _states(client, shards=shards, group=args.group)).items():
            print(f"queue {queue}:")
            for state in states:
                mark = "" if state.in_count else ("  draining" if state.draining else "  removed")
                s = state.stats
                print(f"  {s.stream:<40} length {s.length:>8}  pending {s.pending:>6}{mark}")
    return 0


async def _set(args: argparse.Namespace, settings: Settings) -> int:
    async with redis_client(settings) as client:
        was = await change_shard_count(client, args.count)
        print(f"{SHARDS_KEY}: {was} -> {args.count}", flush=True)
        if args.no_wait:
            print("not waiting: removed shards drain as workers read them")
            return 0
        await asyncio.sleep(args.refresh_wait)  # let every process read the new count
        return await _wait_drained(client, args)


async def _wait_drained(client: RedisClient, args: argparse.Namespace) -> int:
    started = time.monotonic()
    reported = 0.0
    while True:
        states = await _states(client, shards=args.count, group=args.group)
        left = [s for per_queue in states.values() for s in per_queue if s.draining]
        if not left:
            print(f"applied: {args.count} shards in force; no entries left on removed shards")
            return 0
        elapsed = time.monotonic() - started
        if args.timeout and elapsed >= args.timeout:
            print(
                f"still draining after {elapsed:.0f} s (the count is in force; workers keep "
                f"reading): {', '.join(_describe(s) for s in left)}"
            )
            return 1
        if elapsed - reported >= args.progress_every or reported == 0.0:
            reported = elapsed or 1e-9
            total = sum(s.stats.length for s in left)
            print(
                f"draining {len(left)} removed shards, {total} entries left: "
                f"{', '.join(_describe(s) for s in left)}",
                flush=True,
            )
        await asyncio.sleep(0.5)
