"""The dispatcher ``orders`` of ``tests.operator_kit.dispatcher()`` on the local cluster, as the
tests of the operator in the test's own event loop write and read it: its spec, its objects,
its status and conditions, its Events.

The setting of those tests (``tests/e2e/test_operator_*.py`` but ``_ha`` and ``_console``,
which install the chart): the operator runs in the test's event loop
(``tests.fix_live_operator``) against the local cluster's API server, in a namespace of each
test's own, with the machine's Redis; ``orders`` has no migration Job and no enqueuer replica
unless a test says so (``idle()``: no worker Pod either). The helpers of that setting are
written here once; a test module imports them, never another test module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from dispatcher.controller.conditions import OutboxDispatcherStatus
from tests.e2e.cluster_objects import condition as condition_in
from tests.e2e.cluster_objects import events_in
from tests.fix_live_operator import LiveNamespace
from tests.operator_kit import dispatcher
from tests.waiting import eventually

__all__ = [
    "EMAILS", "NAME", "WORKERS", "body", "burst", "condition", "condition_of", "container",
    "deployment", "events", "get", "idle", "replicas", "scaled", "settled", "shows",
    "status_of", "templates", "until",
]  # fmt: skip

NAME = "orders"
WORKERS = ("orders-worker-emails", "orders-worker-invoices")
EMAILS = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1, "maxReplicas": 5}


def body(live: LiveNamespace, *queues: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """``dispatcher()`` in the test's namespace (its two queues unless ``queues`` are given),
    with no migration Job and no enqueuer Pod unless ``spec`` says otherwise."""
    found = dispatcher(NAME, **{"migrate": False, "enqueuer": {"replicas": 0}, **spec})
    if queues:
        found["spec"]["queues"] = list(queues)
    found["metadata"]["namespace"] = live.name
    return found


def idle(live: LiveNamespace, *queues: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """``body()`` with no worker Pod either (every queue from ``minReplicas: 0`` unless it
    says otherwise): its Deployments become available at once."""
    found = body(live, *queues, **spec)
    for queue in found["spec"]["queues"]:
        queue.setdefault("minReplicas", 0)
    return found


async def get(live: LiveNamespace, kind: str, name: str) -> dict[str, Any] | None:
    """The object, None while there is none."""
    return await asyncio.to_thread(live.get, kind, name)


async def deployment(live: LiveNamespace, name: str) -> dict[str, Any]:
    found = await get(live, "deployment", name)
    assert found is not None, f"no Deployment {name}"
    return found


async def replicas(live: LiveNamespace, name: str) -> int | None:
    found = await get(live, "deployment", name)
    return None if found is None else int(found["spec"]["replicas"])


async def scaled(live: LiveNamespace, wanted: int) -> bool:
    return await replicas(live, WORKERS[0]) == wanted


def container(workload: dict[str, Any] | None) -> dict[str, Any]:
    """The first container of a Deployment's or Job's Pod template ({} while there is none)."""
    pod = (workload or {}).get("spec", {}).get("template", {}).get("spec", {})
    return dict((pod.get("containers") or [{}])[0])


async def status_of(live: LiveNamespace) -> OutboxDispatcherStatus:
    cr = await get(live, "obd", NAME) or {}
    return OutboxDispatcherStatus.model_validate(cr.get("status") or {})


async def condition(live: LiveNamespace, type_: str) -> dict[str, Any]:
    """A condition of the dispatcher's status as written ({} while it is absent)."""
    return condition_in(await get(live, "obd", NAME) or {}, type_) or {}


async def condition_of(live: LiveNamespace, type_: str) -> tuple[str, str] | None:
    """A condition of the dispatcher's status as ``(status, reason)``, None while absent."""
    return await asyncio.to_thread(live.condition, NAME, type_)


async def shows(live: LiveNamespace, type_: str, status: str, reason: str) -> bool:
    return await condition_of(live, type_) == (status, reason)


def until(check: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    """``check``'s first true answer, asked every half second for up to a minute."""
    return eventually(check, within=60, interval=0.5)


async def events(live: LiveNamespace, reason: str | None = None) -> list[dict[str, Any]]:
    """The namespace's Events (with ``reason``: only those)."""
    return await asyncio.to_thread(events_in, live.cluster, live.name, reason=reason)


async def settled(live: LiveNamespace, *, ready: bool = False) -> None:
    """Every Deployment there and ``Degraded=False`` (with ``ready``: ``Ready=True`` too)."""

    async def check() -> bool:
        for name in ("orders-enqueuer", *WORKERS):
            if await get(live, "deployment", name) is None:
                return False
        return await condition_of(live, "Degraded") == ("False", "AsExpected") and (
            not ready or await condition_of(live, "Ready") == ("True", "Reconciled")
        )

    await eventually(check, within=90, interval=0.5, what="the dispatcher settled")


async def templates(live: LiveNamespace) -> dict[str, Any]:
    return {
        n: (await deployment(live, n))["spec"]["template"] for n in ("orders-enqueuer", *WORKERS)
    }


async def burst(client: Any, entries: int) -> None:
    """``entries`` over the two shards of ``emails``, all at once as a pass sees them."""
    async with client.pipeline(transaction=True) as pipe:
        for i in range(entries):
            pipe.xadd(f"workflow.tasks.emails.{i % 2}", {"task_id": f"t{i}"})
        await pipe.execute()
