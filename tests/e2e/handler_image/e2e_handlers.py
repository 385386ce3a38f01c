"""Handlers of the e2e tests' handler image, run by worker Pods on the local cluster.

A file of its own rather than part of ``tests/handlers.py``: the image is built as users build
theirs (``Containerfile``: FROM the worker image, one handler module copied onto ``/app``), so
it holds this one module, from this folder as its build context, and nothing of ``tests``.
``slow`` leaves marks in the worker's own Redis (``REDIS_URL``), so a test can tell how often
and how far each task ran; ``noop`` does nothing.
"""

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


async def noop(message: TaskMessage) -> None:
    """Do nothing."""
