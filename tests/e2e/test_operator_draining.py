"""Shards and queues taken away are drained before they go: a lower shard count is in
force at once (no pod restarts) and ``ShardsDraining`` names what the removed shards still
hold; a removed queue keeps one worker until its streams hold no entry and none pending.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dispatcher.stream.naming import SHARDS_KEY
from tests.e2e.live_dispatcher import (
    condition,
    condition_of,
    get,
    idle,
    settled,
    shows,
    status_of,
    templates,
    until,
)
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(600)


async def test_shard_count_changes_restart_no_pod_and_a_decrease_reports_draining(
    live_namespace: LiveNamespace, live_redis: Any
) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, shards=4))
        await settled(live, ready=True)
        assert await live_redis.get(SHARDS_KEY) == "4"
        before = await templates(live)
        for template in before.values():
            assert "STREAM_SHARDS" not in {
                e["name"] for e in template["spec"]["containers"][0]["env"]
            }

        await asyncio.to_thread(live.apply, idle(live, shards=8))  # raising: immediate

        async def raised() -> bool:
            return await live_redis.get(SHARDS_KEY) == "8" and (await status_of(live)).shards == 8

        await until(raised)
        assert await templates(live) == before

        # Shard 6 holds one entry and one delivered-unacked entry when the count drops to 2.
        old = "workflow.tasks.emails.6"
        await live_redis.xgroup_create(old, "workers", id="0", mkstream=True)
        await live_redis.xadd(old, {"task_id": "t1"})
        await live_redis.xadd(old, {"task_id": "t2"})
        ((_, ((held, _),)),) = await live_redis.xreadgroup("workers", "w1", {old: ">"}, count=1)
        await asyncio.to_thread(live.apply, idle(live, shards=2))

        async def draining() -> bool:
            return (
                await live_redis.get(SHARDS_KEY) == "2"  # in force at once: publishing moves now
                and (await status_of(live)).shards == 2
                and await condition_of(live, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")
            )

        await until(draining)
        found = (await status_of(live)).condition("ShardsDraining")
        assert found is not None
        assert f"{old} (length 2, pending 1)" in found.message
        assert await condition_of(live, "Degraded") == ("False", "AsExpected")
        assert await templates(live) == before  # no worker restarted by the decrease

        (rest,) = [i for i, _ in await live_redis.xrange(old) if i != held]
        await live_redis.xdel(old, rest, held)  # no entries left, but one still pending: draining

        async def pending_only() -> bool:
            found = (await status_of(live)).condition("ShardsDraining")
            return found is not None and f"{old} (length 0, pending 1)" in found.message

        await until(pending_only)
        assert await condition_of(live, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")
        await live_redis.xack(old, "workers", held)  # drained

        await until(lambda: shows(live, "ShardsDraining", "False", "AsExpected"))
        assert await templates(live) == before


async def test_a_removed_queue_keeps_its_workers_until_its_streams_are_drained(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    live = live_namespace
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stream = "workflow.tasks.invoices.1"
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live))
        await eventually(lambda: get(live, "deployment", "orders-worker-invoices"), within=60)
        client.xadd(stream, {"task_id": "t1"})
        client.xgroup_create(stream, "workers", id="0")
        client.xreadgroup("workers", "w1", {stream: ">"}, count=1)
        emails = idle(live)["spec"]["queues"][:1]
        await asyncio.to_thread(live.apply, idle(live, *emails))

        async def draining() -> bool:
            found = await get(live, "deployment", "orders-worker-invoices") or {}
            return await shows(live, "QueuesDraining", "True", "Draining") and (
                found.get("spec", {}).get("replicas") == 1  # minReplicas was 0: one drains it
            )

        await until(draining)
        assert "invoices" in (await condition(live, "QueuesDraining"))["message"]
        ((entry, _),) = client.xrange(stream)
        client.xdel(stream, entry)  # no entry left, but one delivered and not acked

        async def still_pending() -> bool:
            found = await condition(live, "QueuesDraining")
            return "invoices: 0 entries, 1 pending" in found.get("message", "")

        await until(still_pending)
        assert await get(live, "deployment", "orders-worker-invoices") is not None
        client.xack(stream, "workers", entry)  # acked: drained

        async def deleted() -> bool:
            return await get(live, "deployment", "orders-worker-invoices") is None and await shows(
                live, "QueuesDraining", "False", "Drained"
            )

        await until(deleted)
    client.close()
