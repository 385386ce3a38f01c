"""Handlers and task publishing for the worker tests and the benchmark.

Subprocess workers import these by path (``--handler tests.handlers:slow``).
Handlers that record what they saw push to a Redis list named by the
environment (``HANDLER_REDIS_URL``, ``HANDLER_LOG_KEY``), so the test can read
it after the worker process is gone.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis as sync_redis

from dispatcher.models import TaskDispatch, TaskMessage, payload_fields
from dispatcher.redis_client import RedisClient
from dispatcher.stream import RedisStreamPublisher, shard_for, task_stream

GROUP = "workers"


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


@cache
def _log() -> tuple[sync_redis.Redis, str]:
    client = sync_redis.Redis.from_url(os.environ["HANDLER_REDIS_URL"], decode_responses=True)
    return client, os.environ["HANDLER_LOG_KEY"]


def slow(message: TaskMessage) -> None:
    """Record ``started:<task>``, sleep ``input["sleep"]`` seconds, record ``done:<task>``."""
    client, key = _log()
    client.rpush(key, f"started:{message.task_id}")
    time.sleep(float(message.input["sleep"]) if isinstance(message.input, dict) else 0.0)
    client.rpush(key, f"done:{message.task_id}")


async def noop(message: TaskMessage) -> None:
    """Do nothing (the benchmark's handler)."""


def exclusive(message: TaskMessage) -> None:
    """Record a run, and ``overlap:<task>`` if another run of the task is still alive.

    A run marks the task with its process id while it runs. A mark left by a
    process that is gone (killed mid-run) is not an overlap. The first run of
    a task sleeps ``input["first_sleep"]`` seconds; later runs return at once.
    """
    client, key = _log()
    mark = f"{key}:running:{message.task_id}"
    holder = client.get(mark)
    if holder is not None and _alive(int(holder)):
        client.rpush(key, f"overlap:{message.task_id}")
    client.set(mark, os.getpid())
    run = client.incr(f"{key}:runs:{message.task_id}")
    client.rpush(key, f"started:{message.task_id}")
    if run == 1 and isinstance(message.input, dict):
        time.sleep(float(message.input.get("first_sleep", 0)))
    client.delete(mark)
    client.rpush(key, f"done:{message.task_id}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
