"""Operator tests moved from kmock to the real API server (kmock has no server-side apply).

Same setting as ``test_operator_api``: the operator in the test's event loop
(``tests.fix_live_operator``), a namespace per test, workloads scaled to zero.

- A spec change reaches the Deployments (handler, concurrency, the enqueuer's batch size) and
  a removed queue's worker Deployment is deleted once its (empty) streams are drained.
- Budgets: the enqueuer's and each multi-replica queue's; lowering a queue to one replica
  drops its budget.
- A rotated Secret rolls the pods that read it (within ``secret_ttl``), and only those.
- Deleting a dispatcher needs no operator (no finalizer; an older one's is released).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from dispatcher._testing.waiting import eventually
from tests.fix_kube import dispatcher
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.suite_servers import postgres_admin_url

pytestmark = pytest.mark.timeout(600)


def idle(live: LiveNamespace, queues: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """An ``orders`` dispatcher with no pod to run: no enqueuer replica, no migration Job."""
    for queue in queues:
        queue.setdefault("minReplicas", 0)
    body = dispatcher(
        "orders", migrate=False, queues=queues, **{"enqueuer": {"replicas": 0}, **spec}
    )
    body["metadata"]["namespace"] = live.name
    return body


async def get(live: LiveNamespace, kind: str, name: str) -> dict[str, Any] | None:
    return await asyncio.to_thread(live.get, kind, name)


def args(deployment: dict[str, Any] | None) -> list[str]:
    containers = (deployment or {}).get("spec", {}).get("template", {}).get("spec", {})
    return list((containers.get("containers") or [{}])[0].get("args") or [])


async def test_a_spec_change_reaches_the_deployments_and_a_removed_queue_goes(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    invoices = {"name": "invoices", "handler": "billing:render"}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, [emails, invoices]))
        await eventually(
            lambda: get(live, "deployment", "orders-worker-invoices"), within=60, interval=0.5
        )
        changed = {**emails, "handler": "app.tasks:send_v2", "concurrency": 32}
        spec = idle(live, [changed], enqueuer={"replicas": 0, "batchSize": 200})
        await asyncio.to_thread(live.apply, spec)

        async def applied() -> bool:
            worker = await get(live, "deployment", "orders-worker-emails")
            gone = await get(live, "deployment", "orders-worker-invoices")
            return "--handler=app.tasks:send_v2" in args(worker) and gone is None

        await eventually(applied, within=60, interval=0.5)
        assert "--concurrency=32" in args(await get(live, "deployment", "orders-worker-emails"))
        assert "--batch-size=200" in args(await get(live, "deployment", "orders-enqueuer"))

        async def observed() -> bool:
            cr = await get(live, "obd", "orders") or {}
            return (cr.get("status") or {}).get("observedGeneration") == 2

        await eventually(observed, within=60, interval=0.5)


async def test_budgets_for_the_enqueuer_and_multi_replica_queues(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    single = {"name": "single", "handler": "app.tasks:one", "maxReplicas": 1}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, [emails, single]))

        async def budgets() -> bool:
            return bool(await get(live, "pdb", "orders-enqueuer")) and bool(
                await get(live, "pdb", "orders-worker-emails")
            )

        await eventually(budgets, within=60, interval=0.5)
        assert await get(live, "pdb", "orders-worker-single") is None  # one replica: no budget
        listed = await asyncio.to_thread(live.kubectl, "get", "pdb", "-o", "json")
        assert {b["spec"]["maxUnavailable"] for b in json.loads(listed)["items"]} == {1}
        # Lowering a queue to one replica drops its budget (a drain must be able to move it).
        await asyncio.to_thread(live.apply, idle(live, [{**emails, "maxReplicas": 1}]))

        async def dropped() -> bool:
            return await get(live, "pdb", "orders-worker-emails") is None

        await eventually(dropped, within=60, interval=0.5)
        assert await get(live, "pdb", "orders-enqueuer") is not None


def annotations(deployment: dict[str, Any] | None) -> dict[str, str]:
    template = (deployment or {}).get("spec", {}).get("template", {})
    return dict(template.get("metadata", {}).get("annotations") or {})


async def test_rotating_a_referenced_secret_rolls_the_pods_that_use_it(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """Within ``secret_ttl`` (1 s here) of a rotation, the pods that read it roll, and only
    those; no URL is written into a Deployment."""
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send"}
    names = ("orders-enqueuer", "orders-worker-emails")
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, idle(live, [emails]))
        await eventually(lambda: get(live, "deployment", names[1]), within=60, interval=0.5)
        await eventually(lambda: get(live, "deployment", names[0]), within=60, interval=0.5)
        before = {name: annotations(await get(live, "deployment", name)) for name in names}

        def rotate(secret: str, url: str) -> None:
            encoded = base64.b64encode(url.encode()).decode()
            patch = json.dumps({"data": {"url": encoded}})
            live.kubectl("patch", "secret", secret, "--type=merge", "-p", patch)

        await asyncio.to_thread(rotate, "pg", postgres_admin_url() + "?application_name=rotated")

        async def enqueuer_rolled() -> bool:
            return annotations(await get(live, "deployment", names[0])) != before[names[0]]

        await eventually(enqueuer_rolled, within=60, interval=0.5)
        assert annotations(await get(live, "deployment", names[1])) == before[names[1]]
        await asyncio.to_thread(rotate, "rd", redis_url + "?health_check_interval=10")

        async def worker_rolled() -> bool:
            return annotations(await get(live, "deployment", names[1])) != before[names[1]]

        await eventually(worker_rolled, within=60, interval=0.5)
        listed = await asyncio.to_thread(live.kubectl, "get", "deployments", "-o", "json")
        assert redis_url not in listed


async def test_deleting_a_dispatcher_needs_no_operator(live_namespace: LiveNamespace) -> None:
    """The operator puts no finalizer on a dispatcher (and releases the one an older version
    added): with the operator gone, deleting it completes, and the garbage collector takes
    the Deployments it owned."""
    live = live_namespace
    body = idle(live, [{"name": "emails", "handler": "app.tasks:send"}])
    body["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, body)

        async def released() -> bool:
            cr = await get(live, "obd", "orders") or {}
            worker = await get(live, "deployment", "orders-worker-emails")
            return worker is not None and not cr.get("metadata", {}).get("finalizers")

        await eventually(released, within=60, interval=0.5)
    # The operator is gone (helm uninstall).
    await asyncio.to_thread(live.kubectl, "delete", "obd", "orders", "--wait=false")

    async def gone() -> bool:
        return await get(live, "obd", "orders") is None and (
            await get(live, "deployment", "orders-worker-emails") is None
        )

    await eventually(gone, within=60, interval=0.5)
