"""Dead letters replayed or deleted: ``outbox_dlq`` rows and ``workflow.dead.<queue>`` entries.

The one code path of ``dispatcher dlq replay``/``delete`` and of the console.
``replay_outbox_dlq`` runs in one transaction and is all-or-nothing: naming an
id that is not in ``outbox_dlq`` replays nothing (so does deleting). ``replay_dead_stream``
moves entries of ``workflow.dead.<queue>`` back to the queue, to the task's
shard under the count in force (the shard they came from may have been
removed since), as the enqueuer routes a replayed outbox row, each attempt
with a fresh run budget (its run count is deleted before the XADD). XADD
first, then XDEL: a crash in between duplicates, never loses. Entries named
by id are read one by one (``XRANGE id id``), ``--all`` a page at a time:
a stream of a million dead letters is never read whole into memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from redis.exceptions import ResponseError

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import dead_letter_stream, shard_for, task_stream
from dispatcher.worker.dead_letter import original_fields
from dispatcher.worker.dedup import attempt_key

__all__ = [
    "ReplayError",
    "Replayed",
    "delete_dead_letters",
    "delete_outbox_dlq",
    "replay_dead_stream",
    "replay_outbox_dlq",
]

_PAGE = 500


class ReplayError(ValueError):
    """Nothing was replayed; the message says why."""


@dataclass(frozen=True, slots=True)
class Replayed:
    ids: list[str]
    dry_run: bool


async def replay_outbox_dlq(
    conn: psycopg.AsyncConnection[Any],
    *,
    ids: Sequence[str] = (),
    all_rows: bool = False,
    dry_run: bool = False,
) -> Replayed:
    """Move the chosen ``outbox_dlq`` rows back to PENDING, attempts reset."""
    params = {"ids": list(ids), "all": all_rows}
    async with conn.transaction():
        cur = await conn.execute(QUERIES["dlq_select"], params)
        found = [str(r[0]) for r in await cur.fetchall()]
        missing = sorted(set(ids) - set(found))
        if missing:
            raise ReplayError(f"not in outbox_dlq: {', '.join(missing)}; nothing replayed")
        if dry_run:
            return Replayed(found, dry_run=True)
        try:
            cur = await conn.execute(QUERIES["dlq_replay"], params)
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name != "outbox_stream_check":
                raise
            raise ReplayError(
                "a chosen row names a stream that is not a task stream (workflow.tasks.<queue>) "
                "and can never be published; nothing replayed (replay the others with --id)"
            ) from exc
        return Replayed(sorted(str(r[0]) for r in await cur.fetchall()), dry_run=False)


async def delete_outbox_dlq(
    conn: psycopg.AsyncConnection[Any], *, ids: Sequence[str] = (), all_rows: bool = False
) -> Replayed:
    """Delete the chosen ``outbox_dlq`` rows for good, all or nothing."""
    params = {"ids": list(ids), "all": all_rows}
    async with conn.transaction():
        cur = await conn.execute(QUERIES["dlq_delete"], params)
        gone = sorted(str(r[0]) for r in await cur.fetchall())
        missing = sorted(set(ids) - set(gone))
        if missing:  # raising rolls the deletes back
            raise ReplayError(f"not in outbox_dlq: {', '.join(missing)}; nothing deleted")
    return Replayed(gone, dry_run=False)


async def _chosen(
    client: RedisClient, dead: str, *, ids: Sequence[str], all_entries: bool
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The entries named (each by its id) or every entry, a page at a time, oldest first."""
    if not all_entries:
        for entry_id in dict.fromkeys(ids):
            try:
                found: list[Any] = await client.xrange(dead, entry_id, entry_id, count=1)  # type: ignore[assignment]
            except ResponseError:  # not a stream id at all
                found = []
            if found:
                yield found[0]
        return
    start = "-"
    while page := cast(list[Any], await client.xrange(dead, start, "+", count=_PAGE)):
        for entry in page:
            yield (str(entry[0]), entry[1])
        start = "(" + str(page[-1][0])


async def _missing(
    client: RedisClient, dead: str, *, ids: Sequence[str], all_entries: bool, what: str
) -> list[tuple[str, dict[str, str]]]:
    """The chosen entries; ``ReplayError`` naming those not there, before anything changes."""
    chosen = [entry async for entry in _chosen(client, dead, ids=ids, all_entries=all_entries)]
    missing = sorted(set(ids) - {i for i, _ in chosen})
    if missing:
        raise ReplayError(f"not in {dead}: {', '.join(missing)}; nothing {what}")
    return chosen


async def delete_dead_letters(
    client: RedisClient, queue: str, *, ids: Sequence[str] = (), all_entries: bool = False
) -> Replayed:
    """Delete the chosen dead letters of ``queue`` for good; none when one named is missing."""
    dead = dead_letter_stream(queue)
    chosen = await _missing(client, dead, ids=ids, all_entries=all_entries, what="deleted")
    for start in range(0, len(chosen), _PAGE):
        await client.xdel(dead, *(i for i, _ in chosen[start : start + _PAGE]))
    return Replayed([i for i, _ in chosen], dry_run=False)


async def replay_dead_stream(
    client: RedisClient,
    queue: str,
    *,
    ids: Sequence[str] = (),
    all_entries: bool = False,
    shards: int = 1,
    dry_run: bool = False,
) -> Replayed:
    """Move dead letters of ``queue`` back to the task's shard at ``shards`` shards."""
    dead = dead_letter_stream(queue)
    chosen = await _missing(client, dead, ids=ids, all_entries=all_entries, what="replayed")
    if dry_run:
        return Replayed([i for i, _ in chosen], dry_run=True)
    for entry_id, fields in chosen:
        target = task_stream(queue, shard_for(fields.get("task_id", ""), shards))
        original = original_fields(fields)
        with contextlib.suppress(MalformedMessage):  # never claimed, so never counted
            await client.delete(attempt_key(TaskMessage.from_fields(original).dedup_key))
        await client.xadd(target, original)  # type: ignore[arg-type]
        await client.xdel(dead, entry_id)
    return Replayed([i for i, _ in chosen], dry_run=False)
