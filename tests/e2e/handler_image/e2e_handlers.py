"""Handlers of the e2e tests' handler image: each run of a task leaves marks in the worker's
own Redis (``REDIS_URL``), so a test can tell how often and how far each task ran."""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as redis

from dispatcher import TaskMessage

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["REDIS_URL"])
    return _client


async def slow(message: TaskMessage) -> None:
    """Count the run (``e2e:runs:<task>``), sleep ``input["seconds"]``, then mark it done
    (``e2e:done:<task>``)."""
    client = _redis()
    await client.incr(f"e2e:runs:{message.task_id}")
    seconds = message.input.get("seconds", 0) if isinstance(message.input, dict) else 0
    await asyncio.sleep(float(seconds))
    await client.set(f"e2e:done:{message.task_id}", 1)
