"""Outbox rows in tests: insert one as it is, and read where rows went.

``INSERT_ONE`` stores a row exactly as given (a payload the application API
would refuse, say); ``outbox_status``, ``dead_letters`` and ``published`` read
what the outbox, its DLQ and the task streams hold.
"""

from __future__ import annotations

import json

import psycopg

from dispatcher.redis_client import RedisClient
from dispatcher.stream import queue_streams

INSERT_ONE = """
INSERT INTO outbox (id, task_id, stream, payload, type, max_retries, backoff_seconds)
VALUES (%(id)s, %(id)s, %(stream)s, %(payload)s::jsonb, 'TASK_EXECUTION', %(retries)s, 1)
"""


def outbox_status(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall()
    return {status: int(count) for status, count in rows}


def dead_letters(db_url: str) -> dict[str, tuple[int, str]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT id, attempts, last_error FROM outbox_dlq").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def flat_payload(task_id: str) -> str:
    return json.dumps({"task_id": task_id, "input": "{}"})


async def published(client: RedisClient, queue: str, shards: int = 4) -> list[dict[str, str]]:
    """Every entry on every shard stream of ``queue`` (with ``_stream`` added)."""
    out: list[dict[str, str]] = []
    for stream in queue_streams([queue], shards):
        for _id, fields in await client.xrange(stream):
            out.append({**fields, "_stream": stream})
    return out
