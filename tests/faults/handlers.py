"""The fault suite's handler: run a task, then log the run where no fault reaches it.

Worker processes load ``tests.faults.handlers:record``. Every successful run
appends one JSON record (task, attempt, outbox id, consumer) to a Redis list
on the recorder, a redis-server no scenario ever faults (``FAULT_RECORD_URL``,
``FAULT_RECORD_KEY``; the consumer name comes from ``FAULT_CONSUMER``).
A task's ``input`` steers the run: ``{"sleep": s}`` takes ``s`` seconds,
``{"poison": true}`` always raises.
"""

from __future__ import annotations

import json
import os
import time
from functools import cache

import redis as sync_redis

from dispatcher.models import TaskMessage


class PoisonTask(RuntimeError):
    """Raised for every run of a poison task."""


@cache
def _recorder() -> tuple[sync_redis.Redis, str, str]:
    client = sync_redis.Redis.from_url(os.environ["FAULT_RECORD_URL"], decode_responses=True)
    return client, os.environ["FAULT_RECORD_KEY"], os.environ.get("FAULT_CONSUMER", "?")


def record(message: TaskMessage) -> None:
    client, key, consumer = _recorder()
    spec = message.input if isinstance(message.input, dict) else {}
    if spec.get("poison"):
        client.incr(f"{key}:poison-runs")
        raise PoisonTask(f"task {message.task_id} is poison")
    if spec.get("sleep"):
        time.sleep(float(spec["sleep"]))
    run = {
        "task": message.task_id,
        "attempt": message.attempt,
        "outbox_id": message.outbox_id,
        "consumer": consumer,
    }
    client.rpush(key, json.dumps(run))
