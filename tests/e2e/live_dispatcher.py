"""The dispatcher ``orders`` of ``tests.fix_kube.dispatcher()`` on the local cluster, as the
operator tests of ``test_operator_ported_a`` read it: its objects, status, Events (#32)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from controller.conditions import OutboxDispatcherStatus
from dispatcher._testing.waiting import eventually
from tests.fix_kube import dispatcher
from tests.fix_live_operator import LiveNamespace

NAME = "orders"
WORKERS = ("orders-worker-emails", "orders-worker-invoices")
EMAILS = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1, "maxReplicas": 5}


def body(live: LiveNamespace, **spec: Any) -> dict[str, Any]:
    """``dispatcher()`` in the test's namespace, with no migration Job and no enqueuer Pod."""
    found = dispatcher(NAME, migrate=False, **{"enqueuer": {"replicas": 0}, **spec})
    found["metadata"]["namespace"] = live.name
    return found


def idle(live: LiveNamespace, **spec: Any) -> dict[str, Any]:
    """``body()`` with no worker Pod either: its Deployments become available at once."""
    queues = [{"name": "emails", "handler": "app.tasks:send", "minReplicas": 0},
              {"name": "invoices", "handler": "billing:render", "minReplicas": 0}]  # fmt: skip
    return body(live, **{"queues": queues, **spec})


async def get(live: LiveNamespace, kind: str, name: str) -> dict[str, Any] | None:
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


def container(found: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = found["spec"]["template"]["spec"]["containers"][0]
    return first


async def status_of(live: LiveNamespace) -> OutboxDispatcherStatus:
    cr = await get(live, "obd", NAME) or {}
    return OutboxDispatcherStatus.model_validate(cr.get("status") or {})


async def condition_of(live: LiveNamespace, type_: str) -> tuple[str, str] | None:
    return await asyncio.to_thread(live.condition, NAME, type_)


async def shows(live: LiveNamespace, type_: str, status: str, reason: str) -> bool:
    return await condition_of(live, type_) == (status, reason)


def until(check: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    return eventually(check, within=60, interval=0.5)


async def events(live: LiveNamespace, reason: str | None = None) -> list[dict[str, Any]]:
    listed = json.loads(await asyncio.to_thread(live.kubectl, "get", "events", "-o", "json"))
    return [e for e in listed["items"] if reason is None or e.get("reason") == reason]


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
