"""Operator tests moved from kmock to the real API server (#32; kmock has no server-side apply).

As in ``test_operator_api``: the operator in the test's event loop (``tests.fix_live_operator``),
a namespace per test, the machine's Redis; no migration Job, no enqueuer replica. A worker
replica a test needs is a Pod the cluster runs (never available: what is checked is what the
operator writes). The autoscaler runs on an injected clock; where a step must see what one
pass decides, the test runs that pass itself (``Operator.sync``).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import kubernetes_validate
import pytest
import redis.asyncio

from dispatcher.stream.naming import SHARDS_KEY
from tests.e2e.live_dispatcher import (
    EMAILS,
    NAME,
    WORKERS,
    body,
    burst,
    condition_of,
    container,
    deployment,
    events,
    get,
    idle,
    replicas,
    scaled,
    settled,
    shows,
    status_of,
    templates,
    until,
)  # fmt: skip
from tests.fix_kube import FakeClock, secret
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.suite_servers import postgres_admin_url

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
async def client(redis_url: str) -> Any:
    conn = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    await conn.aclose()


async def test_apply_creates_enqueuer_and_one_worker_per_queue(
    live_namespace: LiveNamespace, redis_url: str, client: Any
) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, body(live))
        await settled(live)
        cr = await get(live, "obd", NAME)
        assert cr is not None
        enqueuer = container(await deployment(live, "orders-enqueuer"))
        assert (enqueuer["command"], enqueuer["args"][0]) == (["dispatcher"], "enqueuer")
        env = {e["name"]: e for e in enqueuer["env"]}
        assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "pg", "key": "url"}}
        assert env["REDIS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "rd", "key": "url"}}
        assert "STREAM_SHARDS" not in env  # the shard count is read live from Redis
        for name, queue in zip(WORKERS, ("emails", "invoices"), strict=True):
            worker = await deployment(live, name)
            assert container(worker)["args"][:2] == ["worker", f"--queue={queue}"]
            labels = worker["metadata"]["labels"]
            assert labels["dispatch.composer.dev/dispatcher"] == NAME
            assert "app.kubernetes.io/instance" not in labels
            assert labels["app.kubernetes.io/component"] == "worker"
            assert labels["app.kubernetes.io/managed-by"] == "outbox-dispatcher-operator"
            (owner,) = worker["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                "OutboxDispatcher", NAME, cr["metadata"]["uid"], True,
            )  # fmt: skip
            security = container(worker)["securityContext"]
            assert security["runAsNonRoot"] is True
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert security["readOnlyRootFilesystem"] is True
            assert "value" not in {e["name"]: e for e in container(worker)["env"]}["REDIS_URL"]
        assert await replicas(live, WORKERS[0]) == 1  # minReplicas defaults to 1
        assert await replicas(live, WORKERS[1]) == 0

        assert await client.get(SHARDS_KEY) == "2"
        status = await status_of(live)
        assert (status.shards, status.observed_generation) == (2, 1)
        ready = status.condition("Ready")
        assert ready is not None
        assert ready.last_transition_time is not None
        assert ready.observed_generation == 1
        listed = await asyncio.to_thread(live.kubectl, "get", "events,deployments", "-o", "json")
        assert redis_url not in listed  # no secret in any Event or Deployment


async def test_shard_count_changes_restart_no_pod_and_a_decrease_reports_draining(
    live_namespace: LiveNamespace, client: Any
) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, shards=4))
        await settled(live, ready=True)
        assert await client.get(SHARDS_KEY) == "4"
        before = await templates(live)
        for template in before.values():
            assert "STREAM_SHARDS" not in {
                e["name"] for e in template["spec"]["containers"][0]["env"]
            }

        await asyncio.to_thread(live.apply, idle(live, shards=8))  # raising: immediate

        async def raised() -> bool:
            return await client.get(SHARDS_KEY) == "8" and (await status_of(live)).shards == 8

        await until(raised)
        assert await templates(live) == before

        # Shard 6 holds one entry and one delivered-unacked entry when the count drops to 2.
        old = "workflow.tasks.emails.6"
        await client.xgroup_create(old, "workers", id="0", mkstream=True)
        await client.xadd(old, {"task_id": "t1"})
        await client.xadd(old, {"task_id": "t2"})
        ((_, ((held, _),)),) = await client.xreadgroup("workers", "w1", {old: ">"}, count=1)
        await asyncio.to_thread(live.apply, idle(live, shards=2))

        async def draining() -> bool:
            return (
                await client.get(SHARDS_KEY) == "2"  # in force at once: publishing moves now
                and (await status_of(live)).shards == 2
                and await condition_of(live, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")
            )

        await until(draining)
        found = (await status_of(live)).condition("ShardsDraining")
        assert found is not None
        assert f"{old} (length 2, pending 1)" in found.message
        assert await condition_of(live, "Degraded") == ("False", "AsExpected")
        assert await templates(live) == before  # no worker restarted by the decrease

        (rest,) = [i for i, _ in await client.xrange(old) if i != held]
        await client.xdel(old, rest, held)  # no entries left, but one still pending: draining

        async def pending_only() -> bool:
            found = (await status_of(live)).condition("ShardsDraining")
            return found is not None and f"{old} (length 0, pending 1)" in found.message

        await until(pending_only)
        assert await condition_of(live, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")
        await client.xack(old, "workers", held)  # drained

        await until(lambda: shows(live, "ShardsDraining", "False", "AsExpected"))
        assert await templates(live) == before


async def test_backlog_scales_up_at_once_and_down_after_stabilization(
    live_namespace: LiveNamespace, client: Any
) -> None:
    live, clock = live_namespace, FakeClock()
    queue = {**EMAILS, "targetBacklogPerReplica": 100, "scaleDownStabilizationSeconds": 300}
    async with running_live_operator(live, clock=clock) as operator:
        await asyncio.to_thread(live.apply, body(live, queues=[queue]))
        await until(lambda: scaled(live, 1))
        # From here on each step runs one pass itself (besides the operator's own loop): what
        # a pass decides depends on the injected clock and Redis only.
        key = (live.name, NAME)
        await burst(client, 250)  # ceil(250 / 100) = 3 replicas
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.replicas, row.desired_replicas) == (250, 3, 3)
        assert row.last_scale_time == clock.now

        # A worker took 10 entries and has not acked them yet: pending, still in the backlog.
        await client.xgroup_create("workflow.tasks.emails.0", "workers", id="0")
        await client.xreadgroup("workers", "w1", {"workflow.tasks.emails.0": ">"}, count=10)
        await operator.sync(key)
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.pending, row.backlog) == (10, 250)

        await client.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")  # drained
        await operator.sync(key)
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.desired_replicas) == (0, 1)
        clock.advance(299)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3  # still inside the window

        clock.advance(1)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 1

        assert len(await events(live, "Scaled")) == 2  # one Event per change


async def test_missing_secret_and_an_invalid_spec_degrade_or_are_refused(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """The invalid spec of the kmock original (``minReplicas`` above ``maxReplicas``) never
    reaches a real API server's store: the CRD's rule refuses it with the model's message,
    and the running dispatcher is left as it was."""
    live = live_namespace
    await asyncio.to_thread(live.kubectl, "delete", "secret", "pg", "rd")
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live))

        await until(lambda: shows(live, "Degraded", "True", "SecretMissing"))
        assert await condition_of(live, "Ready") == ("False", "SecretMissing")
        await until(lambda: events(live, "SecretMissing"))
        assert await get(live, "deployment", "orders-enqueuer") is None

        pg, rd = secret("pg", url=postgres_admin_url()), secret("rd", url=redis_url)
        await asyncio.to_thread(live.apply, pg, rd)  # retried with backoff: recovers on its own
        await settled(live, ready=True)

        bad = idle(live)
        bad["spec"]["queues"] = [
            {"name": "emails", "handler": "m:f", "minReplicas": 4, "maxReplicas": 2}
        ]
        with pytest.raises(RuntimeError, match="minReplicas must be <= maxReplicas"):
            await asyncio.to_thread(live.apply, bad)
        assert (await status_of(live)).observed_generation == 1
        assert await condition_of(live, "Degraded") == ("False", "AsExpected")


async def test_unreachable_redis_degrades_and_holds_replicas(
    live_namespace: LiveNamespace, redis_url: str, client: Any
) -> None:
    live, clock = live_namespace, FakeClock()
    async with running_live_operator(live, clock=clock, secret_ttl=0.5) as operator:
        await asyncio.to_thread(live.apply, body(live, queues=[EMAILS]))
        await burst(client, 300)

        await until(lambda: scaled(live, 3))

        def rotate(url: str) -> None:
            patch = json.dumps({"data": {"url": base64.b64encode(url.encode()).decode()}})
            live.kubectl("patch", "secret", "rd", "--type=merge", "-p", patch)

        # The Secret now points at a port nobody listens on: Redis is unreachable.
        await asyncio.to_thread(rotate, "redis://:hunter2@127.0.0.1:1/0")

        await until(lambda: shows(live, "Degraded", "True", "RedisUnavailable"))
        found = (await status_of(live)).condition("Degraded")
        assert found is not None
        assert "127.0.0.1:1" in found.message
        await until(lambda: events(live, "RedisUnavailable"))
        assert "hunter2" not in json.dumps(await events(live)) + found.message

        await client.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")
        clock.advance(3600)  # far past the window: with no backlog known, hold anyway
        assert not await operator.sync((live.name, NAME))  # a pass on the advanced clock
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.replicas) == (None, 3)
        assert await replicas(live, WORKERS[0]) == 3

        await asyncio.to_thread(rotate, redis_url)

        await until(lambda: shows(live, "Degraded", "False", "AsExpected"))


async def test_resume_reconciles_resources_that_existed_before_the_operator(
    live_namespace: LiveNamespace, client: Any
) -> None:
    live = live_namespace
    await asyncio.to_thread(live.apply, body(live, shards=3))
    async with running_live_operator(live):
        await settled(live)
    assert await client.get(SHARDS_KEY) == "3"
    assert await replicas(live, WORKERS[0]) == 1
    assert (await status_of(live)).observed_generation == 1


async def test_every_deployment_the_operator_writes_passes_kubernetes_validate(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live))
        await settled(live)
    listed = await asyncio.to_thread(live.kubectl, "get", "deployments", "-o", "json")
    deployments = json.loads(listed)["items"]
    assert len(deployments) == 3
    for found in deployments:
        found = {"apiVersion": "apps/v1", "kind": "Deployment", **found}
        assert kubernetes_validate.validate(found, "1.37.0", strict=True)


async def test_a_spec_change_keeps_the_replicas_the_autoscaler_chose(
    live_namespace: LiveNamespace, client: Any
) -> None:
    """Reconciling a changed spec re-renders the worker Deployment but never resets the
    replicas the backlog asked for: reconcile and autoscale are one decision."""
    live = live_namespace
    queue = {**EMAILS, "targetBacklogPerReplica": 100}
    async with running_live_operator(live, clock=FakeClock()) as operator:
        await asyncio.to_thread(live.apply, body(live, queues=[queue]))
        await until(lambda: scaled(live, 1))
        await burst(client, 250)  # ceil(250 / 100) = 3 replicas
        key = (live.name, NAME)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3

        changed = [{**queue, "handler": "app.tasks:send_v2"}]
        await asyncio.to_thread(live.apply, body(live, queues=changed))

        async def rolled() -> bool:
            await operator.sync(key)
            found = await get(live, "deployment", WORKERS[0]) or {"spec": {}}
            args = found["spec"].get("template", {}).get("spec", {}).get("containers", [{}])
            return "--handler=app.tasks:send_v2" in args[0].get("args", [])

        await until(rolled)
        await operator.sync(key)  # after any pass under way: a reset would be raised again
        assert await replicas(live, WORKERS[0]) == 3, "the spec change reset the scale"
        assert len(await events(live, "Scaled")) == 1, "the spec change reset the scale"
