"""``dispatcher limits`` and ``dispatcher limits set``: see and change queue limits live.

``set`` writes the queue's ``composer:limits:{<queue>}`` (the fields given,
over the ones already there unless ``--clear``); every worker of the queue
applies it within ``REFRESH_EVERY`` seconds. A queue whose limits the
operator owns (``spec.queues[].limits``) gets them back on its next pass.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dispatcher.cli.flags import number
from dispatcher.cli.main import Common, UsageError
from dispatcher.cli.ops import redis_client
from dispatcher.config import Settings
from dispatcher.stream.limit_change import StoredLimitsInvalid, change_limits, requested_limits
from dispatcher.stream.limit_keys import (
    REFRESH_EVERY,
    InvalidLimits,
    limited_queues,
    limits_key,
    read_usage,
    render_usage,
)
from dispatcher.stream.naming import InvalidQueueName, validate_queue

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "limits",
        help="show each queue's limits and their use now; `limits set` changes them live",
        description="Queue limits hold across every worker of a queue: max-in-flight (handler "
        "runs at once) and rate/burst (runs started per second, a token bucket). Without an "
        "action: every queue with limits, the runs holding a slot and the tokens left.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    common(p)
    p.set_defaults(handler=_show)
    actions = p.add_subparsers(dest="limits_command", metavar="ACTION")
    s = actions.add_parser(
        "set",
        help="set or clear a queue's limits; workers apply them within seconds",
        description="Write the fields given over the queue's current limits (all of them "
        "replaced with --clear; --clear alone removes every limit). 0 removes one limit. "
        f"Workers apply a change within {REFRESH_EVERY:g} s.",
    )
    s.add_argument("--queue", required=True, type=_queue, help="the queue")
    s.add_argument(
        "--max-in-flight",
        type=number(int, 0),
        help="handler runs at once across every worker (0: no limit)",
    )
    s.add_argument(
        "--rate", type=number(float, 0), help="runs started per second across workers (0: none)"
    )
    s.add_argument("--burst", type=number(int, 1), help="runs the rate lets start at once")
    s.add_argument("--clear", action="store_true", help="start from no limits")
    common(s)
    s.set_defaults(handler=_set)


def _queue(text: str) -> str:
    try:
        return validate_queue(text)
    except InvalidQueueName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _given(args: argparse.Namespace) -> dict[str, Any]:
    fields = ("max_in_flight", "rate", "burst")
    return {name: getattr(args, name) for name in fields if getattr(args, name) is not None}


async def _set(args: argparse.Namespace, settings: Settings) -> int:
    given = _given(args)
    if not given and not args.clear:  # before connecting: the flags alone say it
        raise UsageError("nothing to set: give --max-in-flight, --rate/--burst or --clear")
    if args.clear:  # the flags alone are the new limits: refused before connecting
        try:
            requested_limits(None, given=given, clear=True)
        except InvalidLimits as exc:
            raise UsageError(f"invalid limits for {args.queue}: {exc}") from None
    async with redis_client(settings) as client:
        try:
            change = await change_limits(client, args.queue, given=given, clear=args.clear)
        except StoredLimitsInvalid as exc:
            raise UsageError(f"{exc}: replace them with --clear") from None
        except InvalidLimits as exc:
            raise UsageError(f"invalid limits for {args.queue}: {exc}") from None
        was = "none" if change.was is None else change.was.describe()
        print(
            f"{limits_key(args.queue)}: {was} -> {change.now.describe()} "
            f"(workers apply it within {REFRESH_EVERY:g} s)"
        )
    return 0


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    async with redis_client(settings) as client:
        usages = [await read_usage(client, queue) for queue in await limited_queues(client)]
    if args.json:
        print(json.dumps([usage.to_json() for usage in usages], indent=2))
    else:
        print("\n".join(render_usage(usages)) or "no queue has limits")
    return 0
