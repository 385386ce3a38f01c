"""Dead-letter replay: outbox_dlq rows back to PENDING, worker dead letters back to their queue.

``replay_outbox_dlq`` runs in one transaction and is all-or-nothing: naming an
id that is not in ``outbox_dlq`` replays nothing. ``replay_dead_stream``
moves entries of ``workflow.dead.<queue>`` back to the queue, to the task's
shard under the count in force (the shard they came from may have been
removed since), as the enqueuer routes a replayed outbox row, each attempt
with a fresh run budget (its run count is deleted before the XADD). XADD
first, then XDEL: a crash in between duplicates, never loses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.models import MalformedMessage, TaskMessage
from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import dead_letter_stream, shard_for, task_stream
from dispatcher.worker.dead_letter import original_fields
from dispatcher.worker.dedup import attempt_key

__all__ = ["ReplayError", "replay_dead_stream", "replay_outbox_dlq"]


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
    entries: list[tuple[str, dict[str, str]]] = await client.xrange(dead)  # type: ignore[assignment]
    chosen = [(i, f) for i, f in entries if all_entries or i in set(ids)]
    missing = sorted(set(ids) - {i for i, _ in chosen})
    if missing:
        raise ReplayError(f"not in {dead}: {', '.join(missing)}; nothing replayed")
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
