"""The console's actions, each the very function its ``dispatcher`` command calls.

- ``dead-letters`` replay: ``dlq replay [--queue Q]``, ``replay_outbox_dlq`` /
  ``replay_dead_stream``;
- ``dead-letters`` delete: ``dlq delete [--queue Q]``, ``delete_outbox_dlq`` /
  ``delete_dead_letters``;
- ``limits``: ``limits set``, ``change_limits``;
- ``cancel``: ``cancel --run R``, ``cancel_run_now``;
- ``shards``: ``shards set N --no-wait``, ``change_shard_count``.

Each takes the request's JSON body, checks its shape (``ValueError``: one
line, nothing done) and returns the line the page shows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.outbox.run_cancel import cancel_run_now
from dispatcher.redis_client import RedisClient
from dispatcher.replay import (
    delete_dead_letters,
    delete_outbox_dlq,
    replay_dead_stream,
    replay_outbox_dlq,
)
from dispatcher.stream.limit_change import StoredLimitsInvalid, change_limits
from dispatcher.stream.limit_keys import REFRESH_EVERY, InvalidLimits
from dispatcher.stream.naming import validate_queue
from dispatcher.stream.shard_count import change_shard_count, parse_shard_count, read_shard_count

__all__ = ["ACTIONS", "Backends"]

log = logging.getLogger("dispatcher.console")


@dataclass(frozen=True, slots=True)
class Backends:
    """What an action may touch: the database (a connection of its own, as the CLI's) and Redis."""

    dsn: str
    redis: RedisClient
    fallback_shards: int


def _queue(body: dict[str, Any], *, required: bool) -> str | None:
    queue = body.get("queue")
    if queue is None and not required:
        return None
    if not isinstance(queue, str):
        raise ValueError("queue: a queue name is required")
    return validate_queue(queue)


def _ids(body: dict[str, Any]) -> tuple[list[str], bool]:
    ids, every = body.get("ids", []), body.get("all", False)
    if not isinstance(every, bool) or not isinstance(ids, list):
        raise ValueError("ids: a list of entry ids; all: true or false")
    if not all(isinstance(i, str) and i for i in ids):
        raise ValueError("ids: every id must be a non-empty string")
    if bool(ids) == every:
        raise ValueError("name the entries (ids) or all of them (all), one of the two")
    return ids, every


async def dead_letters(backends: Backends, body: dict[str, Any]) -> str:
    op = body.get("op")
    if op not in ("replay", "delete"):
        raise ValueError("op: replay or delete")
    queue = _queue(body, required=False)
    ids, every = _ids(body)
    where = "outbox_dlq" if queue is None else f"workflow.dead.{queue}"
    if queue is not None:
        if op == "replay":
            shards = await read_shard_count(backends.redis, fallback=backends.fallback_shards)
            done = await replay_dead_stream(
                backends.redis, queue, ids=ids, all_entries=every, shards=shards
            )
        else:
            done = await delete_dead_letters(backends.redis, queue, ids=ids, all_entries=every)
    else:
        async with await psycopg.AsyncConnection.connect(backends.dsn) as conn:
            if op == "replay":
                done = await replay_outbox_dlq(conn, ids=ids, all_rows=every)
            else:
                done = await delete_outbox_dlq(conn, ids=ids, all_rows=every)
    verb = "replayed" if op == "replay" else "deleted"
    log.info("console: %s %d of %s: %s", verb, len(done.ids), where, " ".join(done.ids))
    return f"{verb} {len(done.ids)} of {where}"


def _number(body: dict[str, Any], name: str, kind: type[int] | type[float]) -> int | float | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: a number")
    if kind is int and value != int(value):
        raise ValueError(f"{name}: a whole number")
    if value < 0:
        raise ValueError(f"{name}: 0 or more")
    return kind(value)


async def limits(backends: Backends, body: dict[str, Any]) -> str:
    queue = _queue(body, required=True)
    assert queue is not None
    given = {
        name: value
        for name, kind in (("max_in_flight", int), ("rate", float), ("burst", int))
        if (value := _number(body, name, kind)) is not None
    }
    clear = body.get("clear", False)
    if not isinstance(clear, bool):
        raise ValueError("clear: true or false")
    try:
        change = await change_limits(backends.redis, queue, given=given, clear=clear)
    except StoredLimitsInvalid as exc:
        raise ValueError(f"{exc}: replace them with Clear") from None
    except InvalidLimits as exc:
        raise ValueError(f"invalid limits for {queue}: {exc}") from None
    was = "none" if change.was is None else change.was.describe()
    log.info("console: limits of %s: %s -> %s", queue, was, change.now.describe())
    return (
        f"limits of {queue}: {was} -> {change.now.describe()} "
        f"(workers apply it within {REFRESH_EVERY:g} s)"
    )


async def cancel(backends: Backends, body: dict[str, Any]) -> str:
    run_id = body.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id: the run to cancel")
    async with await psycopg.AsyncConnection.connect(backends.dsn) as conn:
        removed = await cancel_run_now(conn, run_id)
    log.info("console: run %r cancelled, %d outbox rows removed", run_id, removed)
    return f"run {run_id!r} cancelled; {removed} outbox rows removed"


async def shards(backends: Backends, body: dict[str, Any]) -> str:
    count = body.get("count")
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValueError("count: a whole number >= 1")
    parse_shard_count(count, source="count")
    before = await change_shard_count(backends.redis, count)
    log.info("console: shard count %s -> %d", before, count)
    return (
        f"shard count: {before} -> {count}; enqueuers publish by it within "
        "seconds, removed shards drain as workers read them (shown as draining)"
    )


ACTIONS: dict[str, Callable[[Backends, dict[str, Any]], Awaitable[str]]] = {
    "dead-letters": dead_letters,
    "limits": limits,
    "cancel": cancel,
    "shards": shards,
}
