"""Test data for the suite and the benchmarks: tasks to publish and outbox rows to insert.

``publish`` writes entries as the enqueuer does (same fields, same shard), so
a worker under test cannot tell them from real ones; ``insert_rows`` commits
due outbox rows shaped like ``enqueue_dispatch``'s, built in SQL so ten
thousand rows take milliseconds.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.models import TaskDispatch, payload_fields
from dispatcher.outbox.backoff import DEFAULT_BACKOFF_SECONDS, DEFAULT_MAX_RETRIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamPublisher, shard_for, task_stream
from dispatcher.stream.naming import WORKER_GROUP
from dispatcher.worker.dedup import DONE, attempt_key

__all__ = [
    "GROUP",
    "Attempt",
    "dispatch",
    "hold_lease",
    "insert_rows",
    "publish",
    "read_attempt",
    "tasks",
]

GROUP = WORKER_GROUP

BULK_INSERT = """
INSERT INTO outbox (id, task_id, stream, payload, type, max_retries, backoff_seconds)
SELECT %(prefix)s || g, %(prefix)s || g,
       'workflow.tasks.' || %(queue)s || '.' || (g %% %(shards)s),
       jsonb_build_object('task_id', %(prefix)s || g, 'run_id', 'r', 'workflow_id', 'wf',
                          'workflow_version', 1, 'node_id', 'n', 'node_type', 't',
                          'attempt', 1, 'input', '{}'),
       'TASK_EXECUTION', %(max_retries)s, %(backoff)s
  FROM generate_series(1, %(n)s) AS g
"""


def dispatch(task_id: str, queue: str, **fields: Any) -> TaskDispatch:
    """One task (attempt 1) for ``queue`` with placeholder run, workflow and node; ``fields``
    set any of them."""
    placeholders: dict[str, Any] = {
        "run_id": "r",
        "workflow_id": "wf",
        "workflow_version": 1,
        "node_id": "n",
        "node_type": "t",
    }
    return TaskDispatch(task_id=task_id, queue=queue, **{**placeholders, **fields})


def tasks(queue: str, count: int, *, input: Any = None, prefix: str = "") -> list[TaskDispatch]:
    """``count`` distinct tasks (attempt 1) for ``queue``."""
    tag = prefix or uuid.uuid4().hex[:8]
    return [
        TaskDispatch(
            task_id=f"t-{tag}-{i}",
            run_id=f"run-{tag}",
            workflow_id="wf",
            workflow_version=1,
            node_id=f"n{i}",
            node_type="http",
            queue=queue,
            input=json.dumps(input),
        )
        for i in range(count)
    ]


async def publish(
    client: RedisClient, dispatches: Sequence[TaskDispatch], *, shards: int
) -> list[str]:
    """Publish as the enqueuer does (same fields, same shard); return the entry ids."""
    publisher = RedisStreamPublisher(client, group=GROUP)
    entries = [
        (
            task_stream(d.queue, shard_for(d.task_id, shards)),
            payload_fields(json.dumps(d.payload()), str(n)),
        )
        for n, d in enumerate(dispatches, start=1)
    ]
    ids: list[str] = []
    for start in range(0, len(entries), 500):
        results = await publisher.publish_many(entries[start : start + 500])
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        ids.extend(str(r.entry_id) for r in results)
    return ids


def insert_rows(
    url: str,
    n: int,
    *,
    queue: str,
    shards: int = 4,
    prefix: str = "row-",
    max_retries: int = DEFAULT_MAX_RETRIES,
    backoff: int = DEFAULT_BACKOFF_SECONDS,
) -> list[str]:
    """Insert ``n`` due rows in one transaction; return their ids."""
    params = {"prefix": prefix, "queue": queue, "shards": shards, "n": n}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BULK_INSERT, {**params, "max_retries": max_retries, "backoff": backoff})
    return [f"{prefix}{i}" for i in range(1, n + 1)]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a task attempt's key holds (``dedup.py``), read back by a test."""

    runs: int  # runs started (0 once done)
    done: bool
    holder: str | None  # the token of the lease's holder, while one was taken and not let go
    lease_ms: int  # ms until that lease ends by Redis's clock (<= 0: it ended)


async def read_attempt(client: RedisClient, dedup_key: str) -> Attempt | None:
    """The attempt's key, parsed; None if there is none."""
    raw = await client.get(attempt_key(dedup_key))
    if raw is None:
        return None
    value = raw.decode() if isinstance(raw, bytes) else raw
    if value == DONE:
        return Attempt(runs=0, done=True, holder=None, lease_ms=0)
    if match := re.fullmatch(r"(\d+)\|(.*)\|(\d+)", value):
        runs, holder, ends = match.groups()
        return Attempt(int(runs), False, holder, int(ends) - await _redis_ms(client))
    return Attempt(runs=int(value), done=False, holder=None, lease_ms=0)


async def hold_lease(
    client: RedisClient,
    dedup_key: str,
    *,
    holder: str,
    runs: int = 1,
    lease_ms: int = 30_000,
    window_ms: int = 60_000,
) -> None:
    """Write the attempt's key as a worker holding its lease would (``lease_ms`` from now
    by Redis's clock; negative: a lease that already ended)."""
    ends = await _redis_ms(client) + lease_ms
    await client.set(attempt_key(dedup_key), f"{runs}|{holder}|{ends}", px=window_ms)


async def _redis_ms(client: RedisClient) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000
