"""Workers as the in-process tests run them: on the test's event loop, fast timings, own metrics.

``config(queue)`` is a configuration with short timings; ``running(*workers)``
runs the workers until the block ends (the block starts once every worker is
ready, and a worker that failed to start fails the test at once), then stops
them gracefully. ``recorder`` is a handler that notes each task it saw;
``metric`` reads a sample from a worker's own registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from dispatcher.models import TaskMessage
from dispatcher.worker import Handler, Worker, WorkerConfig
from tests.waiting import eventually

FAST = WorkerConfig(
    queues=("placeholder",),
    concurrency=4,
    reclaim_idle=1.0,
    lease_ttl=2.0,
    dedup_window=120.0,
    max_runs=3,
    shard_poll_interval=0.2,
    stats_interval=0.2,
    grace_period=10.0,
    block_ms=200,
)


def config(queue: str, **changes: Any) -> WorkerConfig:
    return dataclasses.replace(FAST, queues=(queue,), **changes)


@contextlib.asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[None]:
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        await eventually(lambda: _all_ready(workers, runs), within=10)
        yield
    finally:
        for w in workers:
            w.request_stop()
        await asyncio.wait_for(asyncio.gather(*runs), timeout=30)


async def _all_ready(workers: tuple[Worker, ...], runs: list[asyncio.Task[None]]) -> bool:
    for run in runs:
        if run.done():
            run.result()  # surface a start-up failure instead of timing out
    return all(w.ready() for w in workers)


def recorder(seen: list[str]) -> Handler:
    async def handle(message: TaskMessage) -> None:
        seen.append(message.task_id)

    return handle


async def metric(worker: Worker, name: str, **labels: str) -> float:
    return worker.metrics.registry.get_sample_value(name, labels) or 0.0
