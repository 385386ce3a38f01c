"""Handlers that misbehave: what they raise or how they block ends as a failed run or a warning.

Workers are ``Worker`` objects on the test's event loop (see
``test_worker_runtime``). ``SystemExit`` and ``KeyboardInterrupt`` would end
the test session itself if they escaped a worker: they are tested with worker
processes, in ``test_worker_process``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from dispatcher.models import TaskDispatch, TaskMessage
from dispatcher.redis_client import RedisClient
from dispatcher.stream import dead_letter_stream, publish_shard_count
from dispatcher.worker import Worker
from tests.data import publish, tasks
from tests.waiting import eventually
from tests.workers import config, metric, running


class Poison(BaseException):
    """Not an ``Exception``: what a handler may raise all the same."""


async def _handled(worker: Worker, queue: str, count: int) -> bool:
    return await metric(worker, "dispatcher_worker_handled_total", queue=queue) >= count


async def _dead(client: RedisClient, queue: str) -> dict[str, dict[str, str]]:
    """The queue's dead letters by task id."""
    letters = await client.xrange(dead_letter_stream(queue))
    return {fields["task_id"]: fields for _, fields in letters}


def _ids(dispatches: list[TaskDispatch]) -> set[str]:
    return {t.task_id for t in dispatches}


async def test_a_base_exception_is_a_failed_run_and_the_worker_goes_on(
    redis_standalone: RedisClient, queue: str
) -> None:
    """Two poison tasks, concurrency 2: each raises a ``BaseException`` subclass (one at once,
    one after a wait) every run; both are dead-lettered and later tasks are handled."""
    await publish_shard_count(redis_standalone, 1)
    _, after_a_wait = poison = tasks(queue, 2)
    healthy = tasks(queue, 6)

    async def handle(message: TaskMessage) -> None:
        if message.task_id == after_a_wait.task_id:
            await asyncio.sleep(0.01)
        if message.task_id in _ids(poison):
            raise Poison("not an Exception")

    worker = Worker(redis_standalone, handle, config(queue, shards=1, concurrency=2, max_runs=2))
    async with running(worker):
        await publish(redis_standalone, poison, shards=1)

        async def dead() -> bool:
            return len(await _dead(redis_standalone, queue)) == 2

        await eventually(dead, within=30, what="both poison tasks dead-lettered")
        await publish(redis_standalone, healthy, shards=1)
        await eventually(lambda: _handled(worker, queue, len(healthy)), within=30)
        assert worker.ready()

    letters = await _dead(redis_standalone, queue)
    assert set(letters) == _ids(poison)
    for fields in letters.values():
        assert fields["runs"] == "2"
        assert fields["error"] == "failed 2 runs (max runs 2); last error: Poison: not an Exception"
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 4
    assert worker.metrics.running == 0


async def test_a_cancelled_error_raised_by_the_handler_is_a_failed_run_with_its_traceback(
    redis_standalone: RedisClient, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not the worker's cancellation: the run failed, and the log says where it was raised."""
    await publish_shard_count(redis_standalone, 1)
    _, after_a_wait = raising = tasks(queue, 2)

    async def handle(message: TaskMessage) -> None:
        if message.task_id == after_a_wait.task_id:
            await asyncio.sleep(0.01)
        raise asyncio.CancelledError("raised by the handler")

    worker = Worker(redis_standalone, handle, config(queue, shards=1, max_runs=2))
    async with running(worker):
        await publish(redis_standalone, raising, shards=1)

        async def dead() -> bool:
            return len(await _dead(redis_standalone, queue)) == 2

        await eventually(dead, within=30, what="both tasks dead-lettered")

    letters = await _dead(redis_standalone, queue)
    assert set(letters) == _ids(raising)
    for fields in letters.values():
        assert fields["error"] == (
            "failed 2 runs (max runs 2); last error: CancelledError: raised by the handler"
        )
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 4
    tracebacks = [
        r for r in caplog.records if r.exc_info and r.exc_info[0] is asyncio.CancelledError
    ]
    assert len(tracebacks) == 4
    assert all("handler failed" in r.getMessage() for r in tracebacks)


async def test_an_async_handler_blocking_the_loop_is_logged_as_a_stall(
    redis_standalone: RedisClient, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async handler blocks the loop (``time.sleep``) for more than a third of the lease
    TTL: leases cannot be renewed meanwhile, and the worker says so while it happens."""
    await publish_shard_count(redis_standalone, 1)
    (task,) = tasks(queue, 1)

    async def handle(message: TaskMessage) -> None:
        time.sleep(2.0)  # noqa: ASYNC251 - the mistake under test

    worker = Worker(redis_standalone, handle, config(queue, shards=1, lease_ttl=3.0))
    async with running(worker):
        await publish(redis_standalone, [task], shards=1)
        await eventually(lambda: _handled(worker, queue, 1), within=30)

    stalls = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "must not block the event loop" in r.getMessage()
    ]
    assert stalls, [r.getMessage() for r in caplog.records]
    assert "lease" in stalls[0].getMessage()


async def test_a_sync_callable_returning_a_coroutine_is_bound_by_the_handler_timeout(
    redis_standalone: RedisClient, queue: str
) -> None:
    await publish_shard_count(redis_standalone, 1)
    runs: list[str] = []
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def nothing() -> None:
        pass

    def handle(message: TaskMessage) -> Coroutine[Any, Any, None]:  # sync: a thread
        runs.append(message.task_id)
        return forever() if len(runs) == 1 else nothing()

    worker = Worker(redis_standalone, handle, config(queue, shards=1, handler_timeout=0.5))
    async with running(worker):
        await publish(redis_standalone, tasks(queue, 1), shards=1)
        await eventually(lambda: _handled(worker, queue, 1), within=30)

    assert cancelled.is_set()
    assert len(runs) == 2
    assert await metric(worker, "dispatcher_worker_failed_total", queue=queue) == 1
    assert await _dead(redis_standalone, queue) == {}
