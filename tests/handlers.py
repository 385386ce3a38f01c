"""The tests' handlers: what a worker process run from the checkout loads by path
(``--handler tests.handlers:slow``).

- ``noop`` does nothing (a worker that needs a handler and no effect).
- ``slow``, ``exclusive``, ``exclusive_blocking``, ``raises``, ``offloaded`` and ``timed``
  record what they saw in a Redis list named by the environment (``HANDLER_REDIS_URL``,
  ``HANDLER_LOG_KEY``), so a worker process test reads it after the worker is gone.
- ``record`` is the fault suite's: it logs each successful run where no fault reaches it
  (a JSON record on ``FAULT_RECORD_URL``/``FAULT_RECORD_KEY``, a redis-server no scenario
  ever faults; the consumer name from ``FAULT_CONSUMER``), and ``{"poison": true}`` in a
  task's input makes every run raise ``PoisonTask``.

The handlers the Pods of the e2e tests run are in ``tests/e2e/handler_image/e2e_handlers.py``:
that image holds one module, not this package.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from functools import cache

import redis as sync_redis

from dispatcher.models import TaskMessage


async def noop(message: TaskMessage) -> None:
    """Do nothing."""


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


async def exclusive_blocking(message: TaskMessage) -> None:
    """``exclusive``, from an async handler: its sleep blocks the event loop (the mistake)."""
    exclusive(message)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def raises(message: TaskMessage) -> None:
    """Record ``started:<task>``, then raise what ``input["raise"]`` names (after a wait if
    ``input["wait"]``): ``exit`` (``SystemExit(3)``), ``interrupt`` (``KeyboardInterrupt``);
    with neither, record ``done:<task>``."""
    client, key = _log()
    client.rpush(key, f"started:{message.task_id}")
    given = message.input if isinstance(message.input, dict) else {}
    if given.get("wait"):
        await asyncio.sleep(0.01)
    if given.get("raise") == "exit":
        raise SystemExit(3)
    if given.get("raise") == "interrupt":
        raise KeyboardInterrupt
    client.rpush(key, f"done:{message.task_id}")


async def offloaded(message: TaskMessage) -> None:
    """Record ``started:<task>``, then wait ``input["sleep"]`` seconds for a thread of the
    event loop's default executor (which outlives a cancellation of this run)."""
    client, key = _log()
    client.rpush(key, f"started:{message.task_id}")
    seconds = float(message.input["sleep"]) if isinstance(message.input, dict) else 0.0
    await asyncio.to_thread(time.sleep, seconds)
    client.rpush(key, f"done:{message.task_id}")


def timed(message: TaskMessage) -> None:
    """Record ``start:<task>:<time>`` and ``end:<task>:<time>`` around a sleep.

    Sleeps ``input["sleep"]`` seconds, or ``input["first_sleep"]`` on the
    task's first run. The times are the machine's wall clock, taken first
    thing and last thing, so overlapping runs of all processes can be counted.
    """
    started = time.time()
    client, key = _log()
    run = client.incr(f"{key}:runs:{message.task_id}")
    client.rpush(key, f"start:{message.task_id}:{started!r}")
    given = message.input if isinstance(message.input, dict) else {}
    sleep = given.get("first_sleep", 0) if run == 1 and "first_sleep" in given else given["sleep"]
    time.sleep(float(sleep))
    client.rpush(key, f"end:{message.task_id}:{time.time()!r}")


class PoisonTask(RuntimeError):
    """Raised for every run of a poison task."""


@cache
def _recorder() -> tuple[sync_redis.Redis, str, str]:
    client = sync_redis.Redis.from_url(os.environ["FAULT_RECORD_URL"], decode_responses=True)
    return client, os.environ["FAULT_RECORD_KEY"], os.environ.get("FAULT_CONSUMER", "?")


def record(message: TaskMessage) -> None:
    """Run the task (``{"sleep": s}`` takes ``s`` seconds), then log the run on the recorder."""
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
