"""The console's reads on demand: a page of dead letters, one entry's payload.

Pages are cursors, never scans: ``XREVRANGE ... COUNT`` from the last id shown
for ``workflow.dead.<queue>``, a ``(moved_at, id)`` keyset for ``outbox_dlq``.
A page carries each entry's error, runs and source but no payload: a payload is
read only for the one entry a person asks about (``payload``). A run's tasks
have no index to page by: their lookup is a search of bounded steps
(``dispatcher.console.run_search``).
"""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from redis.exceptions import ResponseError

from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import dead_letter_stream
from dispatcher.worker.dead_letter import DEAD_LETTER_FIELDS, original_fields

__all__ = ["dead_letter_page", "dead_letter_payload", "outbox_dlq_page"]

# What a page of worker dead letters shows of each entry: who it is and why it died.
SHOWN_FIELDS = ("task_id", "run_id", "attempt", "node_id", *DEAD_LETTER_FIELDS)
MAX_PAGE = 200


def stamp(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime.datetime) else value


async def dead_letter_page(
    client: RedisClient, queue: str, *, before: str | None, limit: int
) -> dict[str, Any]:
    """Up to ``limit`` dead letters of ``queue``, newest first, older than entry ``before``."""
    dead = dead_letter_stream(queue)
    limit = max(1, min(limit, MAX_PAGE))
    high = "+" if not before else f"({before}"
    try:
        found: list[Any] = await client.xrevrange(dead, high, "-", count=limit + 1)  # type: ignore[assignment]
    except ResponseError as exc:  # a cursor that is not a stream id
        raise ValueError(f"before: not an entry id ({exc})") from None
    entries = [
        {"id": str(entry_id), **{k: fields[k] for k in SHOWN_FIELDS if k in fields}}
        for entry_id, fields in found[:limit]
    ]
    return {
        "queue": queue,
        "total": int(await client.xlen(dead)),
        "entries": entries,
        "next": entries[-1]["id"] if len(found) > limit else None,
    }


async def outbox_dlq_page(
    pool: AsyncConnectionPool[Any], *, before: str | None, limit: int
) -> dict[str, Any]:
    """Up to ``limit`` rows of ``outbox_dlq``, newest first, after the cursor ``before``."""
    limit = max(1, min(limit, MAX_PAGE))
    moved, _, row_id = (before or "").partition("|")
    params = {"before_moved": moved or None, "before_id": row_id, "limit": limit + 1}
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        try:
            await cur.execute(QUERIES["dlq_page"], params)
        except psycopg.errors.DataError as exc:
            raise ValueError(f"before: not a cursor of this page ({exc})") from None
        rows = await cur.fetchall()
        total = await (await conn.execute(QUERIES["dlq_count"])).fetchone()
    entries = [{k: stamp(v) for k, v in row.items()} for row in rows[:limit]]
    last = entries[-1] if entries else None
    return {
        "queue": None,
        "total": int(total[0]) if total else 0,
        "entries": entries,
        "next": f"{last['moved_at']}|{last['id']}" if last and len(rows) > limit else None,
    }


async def dead_letter_payload(
    *, client: RedisClient, pool: AsyncConnectionPool[Any], queue: str | None, entry_id: str
) -> Any:
    """The payload of one dead letter (the fields a replay would publish); KeyError if gone."""
    if queue is None:
        async with pool.connection() as conn:
            row = await (await conn.execute(QUERIES["dlq_payload"], {"id": entry_id})).fetchone()
        if row is None:
            raise KeyError(entry_id)
        return row[0]
    try:
        found: list[Any] = await client.xrange(  # type: ignore[assignment]
            dead_letter_stream(queue), entry_id, entry_id, count=1
        )
    except ResponseError:
        found = []
    if not found:
        raise KeyError(entry_id)
    return original_fields(found[0][1])
