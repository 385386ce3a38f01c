"""The operator may come and go: one that starts reconciles what existed before it, an
upgraded one moves the workloads to its images (unless the spec pins them), and deleting
a dispatcher needs no operator (no finalizer; an older version's is released).

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.stream.naming import SHARDS_KEY
from tests.e2e.live_dispatcher import (
    WORKERS,
    body,
    container,
    get,
    idle,
    replicas,
    settled,
    status_of,
    until,
)
from tests.fix_live_operator import LiveNamespace, running_live_operator

pytestmark = pytest.mark.timeout(600)


async def test_resume_reconciles_resources_that_existed_before_the_operator(
    live_namespace: LiveNamespace, live_redis: Any
) -> None:
    live = live_namespace
    await asyncio.to_thread(live.apply, body(live, shards=3))
    async with running_live_operator(live):
        await settled(live)
    assert await live_redis.get(SHARDS_KEY) == "3"
    assert await replicas(live, WORKERS[0]) == 1
    assert (await status_of(live)).observed_generation == 1


async def test_workload_images_follow_the_operator_unless_the_spec_pins_them(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    pinned = idle(live)
    pinned["spec"]["queues"][1]["image"] = "registry.example.com/billing:7"
    await asyncio.to_thread(live.apply, pinned)

    async def images(tag: str) -> bool:
        names = ("orders-enqueuer", "orders-worker-emails")
        found = [container(await get(live, "deployment", n)).get("image", "") for n in names]
        return found == [f"reg/outbox-dispatcher-enqueuer:{tag}", f"reg/w:{tag}"]

    old = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.0", "worker_image": "reg/w:1.0"}
    async with running_live_operator(live, **old):
        await until(lambda: images("1.0"))
    new = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.1", "worker_image": "reg/w:1.1"}
    async with running_live_operator(live, **new):
        await until(lambda: images("1.1"))
    invoices = container(await get(live, "deployment", "orders-worker-invoices"))
    assert invoices["image"] == "registry.example.com/billing:7"


async def test_deleting_a_dispatcher_needs_no_operator(live_namespace: LiveNamespace) -> None:
    """The operator puts no finalizer on a dispatcher (and releases the one an older version
    added): with the operator gone, deleting it completes, and the garbage collector takes
    the Deployments it owned."""
    live = live_namespace
    cr = idle(live, {"name": "emails", "handler": "app.tasks:send"})
    cr["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, cr)

        async def released() -> bool:
            cr = await get(live, "obd", "orders") or {}
            worker = await get(live, "deployment", "orders-worker-emails")
            return worker is not None and not cr.get("metadata", {}).get("finalizers")

        await until(released)
    # The operator is gone (helm uninstall).
    await asyncio.to_thread(live.kubectl, "delete", "obd", "orders", "--wait=false")

    async def gone() -> bool:
        return await get(live, "obd", "orders") is None and (
            await get(live, "deployment", "orders-worker-emails") is None
        )

    await until(gone)
