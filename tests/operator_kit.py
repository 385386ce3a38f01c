"""What the operator's tests share: the dispatcher they apply, Secrets, a clock that moves
only when told, and kopf run in the test's own event loop (``kopf_running``).

Every one of them runs on the real API server of the local cluster (tests/e2e,
``tests/fix_live_operator.py``); no test talks to an emulated Kubernetes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import kopf

__all__ = [
    "NAME",
    "NAMESPACE",
    "FakeClock",
    "dispatcher",
    "kopf_running",
    "secret",
    "spawned_by_kopf",
]

NAMESPACE = "default"
NAME = "orders"  # the dispatcher the operator tests apply


@dataclass
class FakeClock:
    """The autoscaler's clock: moves only when a test says so."""

    now: datetime.datetime = field(
        default_factory=lambda: datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    )

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


@contextlib.asynccontextmanager
async def kopf_running(
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    *,
    namespace: str,
    ready: asyncio.Event | None = None,
    seconds: float = 30,
) -> AsyncIterator[None]:
    """kopf with ``registry``'s handlers, watching ``namespace``, until the block ends.
    ``ready``: kopf's ready flag (``Operator.started``), raised once its start-up finished."""
    stop, ready = asyncio.Event(), ready or asyncio.Event()
    # spawn_tasks + run_tasks instead of kopf.operator(): at the end kopf cancels every task
    # born after its start, and pytest-asyncio's teardown is one of those.
    before = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=settings,
        standalone=True,
        namespaces=[namespace],
        stop_flag=stop,
        ready_flag=ready,
    )
    await asyncio.wait_for(ready.wait(), seconds)
    try:
        yield
    finally:
        stop.set()
        ignored = before | {t for t in asyncio.all_tasks() if not spawned_by_kopf(t)}
        await asyncio.wait_for(kopf.run_tasks(tasks, ignored=ignored), seconds)


def spawned_by_kopf(task: asyncio.Task[Any]) -> bool:
    """kopf's own tasks (the only ones its shutdown should wait for or cancel)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/kopf/" in code.co_filename


def secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def dispatcher(name: str = NAME, **spec: Any) -> dict[str, Any]:
    """An ``OutboxDispatcher`` with two queues, reading the ``pg`` and ``rd`` Secrets."""
    body: dict[str, Any] = {
        "shards": 2,
        "postgres": {"secretRef": {"name": "pg", "key": "url"}},
        "redis": {"secretRef": {"name": "rd", "key": "url"}},
        "queues": [
            {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5},
            {"name": "invoices", "handler": "billing:render", "minReplicas": 0},
        ],
    }
    body.update(spec)
    return {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }
