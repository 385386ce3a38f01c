"""Operator tests moved from kmock to the real API server (#32), second half.

Same setting as ``test_operator_ported``: the operator in the test's event loop
(``tests.fix_live_operator``), a namespace per test. What kmock faked, the cluster does: the
Deployment controller rolls out (a worker whose pods never get ready stays unavailable). The
migration Job's tests are in ``test_operator_ported_b_migration``.

- ``Ready`` follows the Deployments and ``Progressing`` their rollouts.
- An unreachable Redis or PostgreSQL is ``Degraded`` and not ``Ready``; no password leaks.
- A removed queue keeps one worker until its streams are drained (no entry, none pending).
- Workload images follow the operator's unless the spec pins them.
- Each role reads its own Redis Secret; pod settings reach the Deployments; the operator's
  metrics follow its passes and the autoscaler.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import redis

from dispatcher._testing.waiting import eventually
from dispatcher.stream.naming import SHARDS_KEY
from tests.fix_kube import dispatcher
from tests.fix_live_operator import LiveNamespace, running_live_operator

pytestmark = pytest.mark.timeout(600)

NAME = "orders"
ENQUEUER_V1 = "reg.example.com/enq:1.0"


def body(live: LiveNamespace, *queues: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """An ``orders`` dispatcher (no migration, no enqueuer replica unless ``spec`` says)."""
    found = dispatcher(NAME, **{"migrate": False, "enqueuer": {"replicas": 0}, **spec})
    if queues:
        found["spec"]["queues"] = list(queues)
    for queue in found["spec"]["queues"]:
        queue.setdefault("minReplicas", 0)
    found["metadata"]["namespace"] = live.name
    return found


def put_secret(live: LiveNamespace, name: str, url: str) -> None:
    data = {"url": base64.b64encode(url.encode()).decode()}
    live.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data})


async def get(live: LiveNamespace, kind: str, name: str) -> dict[str, Any] | None:
    return await asyncio.to_thread(live.get, kind, name)


async def condition(live: LiveNamespace, type_: str) -> dict[str, Any]:
    cr = await get(live, "obd", NAME) or {}
    found = [c for c in (cr.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else {}


async def is_(live: LiveNamespace, type_: str, status: str, reason: str) -> bool:
    found = await condition(live, type_)
    return (found.get("status"), found.get("reason")) == (status, reason)


def container(workload: dict[str, Any] | None) -> dict[str, Any]:
    pod = (workload or {}).get("spec", {}).get("template", {}).get("spec", {})
    return dict((pod.get("containers") or [{}])[0])


async def events(live: LiveNamespace) -> str:
    return await asyncio.to_thread(live.kubectl, "get", "events", "-o", "json")


async def test_ready_follows_the_deployments_and_progressing_their_rollouts(
    live_namespace: LiveNamespace,
) -> None:
    """A worker whose pods never get ready (its handler does not import) keeps the dispatcher
    not ``Ready``; a spec change then rolls out and never finishes (the old pod stays until a
    new one is available): ``Progressing``. Scaled to zero, both turn."""
    live = live_namespace
    stuck = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1, "maxReplicas": 1}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, body(live, stuck))

        async def unavailable() -> bool:
            return await is_(live, "Ready", "False", "DeploymentsUnavailable")

        await eventually(unavailable, within=60, interval=0.5)
        await asyncio.to_thread(live.apply, body(live, {**stuck, "handler": "app.tasks:v2"}))

        async def rolling() -> bool:
            cr = await get(live, "obd", NAME) or {}
            return (
                (cr.get("status") or {}).get("observedGeneration") == 2
                and await unavailable()
                and await is_(live, "Progressing", "True", "RollingOut")
                and await is_(live, "Degraded", "False", "AsExpected")
            )

        await eventually(rolling, within=60, interval=0.5)
        assert "orders-worker-emails" in (await condition(live, "Progressing"))["message"]
        message = (await condition(live, "Ready"))["message"]
        assert "orders-worker-emails" in message
        assert "orders-enqueuer" not in message
        # Scaled to zero (at once), the Deployment controller completes the rollout.
        scaled = {**stuck, "minReplicas": 0, "scaleDownStabilizationSeconds": 0}
        await asyncio.to_thread(live.apply, body(live, scaled))

        async def available() -> bool:
            return await is_(live, "Ready", "True", "Reconciled") and await is_(
                live, "Progressing", "False", "RolloutComplete"
            )

        await eventually(available, within=60, interval=0.5)


async def test_unreachable_redis_or_postgres_is_degraded_and_not_ready(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    live = live_namespace
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, body(live))

        async def ready() -> bool:
            return await is_(live, "Ready", "True", "Reconciled")

        await eventually(ready, within=60, interval=0.5)
        await asyncio.to_thread(put_secret, live, "rd", "redis://:hunter2@127.0.0.1:1/0")

        async def down(reason: str) -> bool:
            return await is_(live, "Degraded", "True", reason) and await is_(
                live, "Ready", "False", reason
            )

        await eventually(lambda: down("RedisUnavailable"), within=60, interval=0.5)
        await asyncio.to_thread(put_secret, live, "rd", redis_url)
        await eventually(ready, within=60, interval=0.5)
        await asyncio.to_thread(put_secret, live, "pg", "postgresql://app:hunter2@127.0.0.1:1/app")
        await eventually(lambda: down("PostgresUnavailable"), within=60, interval=0.5)
        degraded = await condition(live, "Degraded")
        assert "127.0.0.1:1" in degraded["message"]
        cr = await get(live, "obd", NAME) or {}
        assert "hunter2" not in json.dumps(cr["status"]) + await events(live)
        assert degraded["observedGeneration"] == cr["status"]["observedGeneration"] == 1


async def test_a_removed_queue_keeps_its_workers_until_its_streams_are_drained(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    live = live_namespace
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stream = "workflow.tasks.invoices.1"
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, body(live))
        await eventually(lambda: get(live, "deployment", "orders-worker-invoices"), within=60)
        client.xadd(stream, {"task_id": "t1"})
        client.xgroup_create(stream, "workers", id="0")
        client.xreadgroup("workers", "w1", {stream: ">"}, count=1)
        emails = body(live)["spec"]["queues"][:1]
        await asyncio.to_thread(live.apply, body(live, *emails))

        async def draining() -> bool:
            found = await get(live, "deployment", "orders-worker-invoices") or {}
            return await is_(live, "QueuesDraining", "True", "Draining") and (
                found.get("spec", {}).get("replicas") == 1  # minReplicas was 0: one drains it
            )

        await eventually(draining, within=60, interval=0.5)
        assert "invoices" in (await condition(live, "QueuesDraining"))["message"]
        ((entry, _),) = client.xrange(stream)
        client.xdel(stream, entry)  # no entry left, but one delivered and not acked

        async def still_pending() -> bool:
            found = await condition(live, "QueuesDraining")
            return "invoices: 0 entries, 1 pending" in found.get("message", "")

        await eventually(still_pending, within=60, interval=0.5)
        assert await get(live, "deployment", "orders-worker-invoices") is not None
        client.xack(stream, "workers", entry)  # acked: drained

        async def deleted() -> bool:
            return await get(live, "deployment", "orders-worker-invoices") is None and await is_(
                live, "QueuesDraining", "False", "Drained"
            )

        await eventually(deleted, within=60, interval=0.5)
    client.close()


async def test_workload_images_follow_the_operator_unless_the_spec_pins_them(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    pinned = body(live)
    pinned["spec"]["queues"][1]["image"] = "registry.example.com/billing:7"
    await asyncio.to_thread(live.apply, pinned)

    async def images(tag: str) -> bool:
        names = ("orders-enqueuer", "orders-worker-emails")
        found = [container(await get(live, "deployment", n)).get("image", "") for n in names]
        return found == [f"reg/outbox-dispatcher-enqueuer:{tag}", f"reg/w:{tag}"]

    old = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.0", "worker_image": "reg/w:1.0"}
    async with running_live_operator(live, **old):
        await eventually(lambda: images("1.0"), within=60, interval=0.5)
    new = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.1", "worker_image": "reg/w:1.1"}
    async with running_live_operator(live, **new):
        await eventually(lambda: images("1.1"), within=60, interval=0.5)
    invoices = container(await get(live, "deployment", "orders-worker-invoices"))
    assert invoices["image"] == "registry.example.com/billing:7"


async def test_each_role_uses_its_own_redis_secret(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """Only the operator's Secret holds a reachable URL: the shard key proves it was used."""
    live = live_namespace
    await asyncio.to_thread(
        put_secret, live, "rd-enqueuer", "redis://dispatcher-enqueuer:pw@redis:6379/0"
    )
    await asyncio.to_thread(put_secret, live, "rd-operator", redis_url)
    refs = {f"{role}SecretRef": {"name": f"rd-{role}", "key": "url"}
            for role in ("enqueuer", "worker", "operator")}  # fmt: skip
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, body(live, redis=refs))

        async def missing() -> bool:
            found = await condition(live, "Degraded")
            return found.get("reason") == "SecretMissing" and "rd-worker" in found["message"]

        await eventually(missing, within=60, interval=0.5)
        assert await get(live, "deployment", "orders-worker-emails") is None
        await asyncio.to_thread(
            put_secret, live, "rd-worker", "redis://dispatcher-worker:pw@redis:6379/0"
        )

        async def applied() -> bool:
            names = ("orders-enqueuer", "orders-worker-emails")
            return all([await get(live, "deployment", name) is not None for name in names])

        await eventually(applied, within=60, interval=0.5)

    async def redis_ref(name: str) -> Any:
        env = container(await get(live, "deployment", name))["env"]
        return next(e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == "REDIS_URL")

    assert await redis_ref("orders-enqueuer") == {"name": "rd-enqueuer", "key": "url"}
    assert await redis_ref("orders-worker-emails") == {"name": "rd-worker", "key": "url"}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.get(SHARDS_KEY) == "2"
    client.close()
    assert redis_url not in await events(live)


async def test_pod_settings_reach_the_deployments(live_namespace: LiveNamespace) -> None:
    live = live_namespace
    settings = {
        "env": [{"name": "APP_MODE", "value": "prod"}],
        "serviceAccountName": "emails-handler",
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "q", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "q"},
        "podLabels": {"team": "mail"},
    }
    async with running_live_operator(live):
        queue = {"name": "emails", "handler": "app.tasks:send", **settings}
        await asyncio.to_thread(live.apply, body(live, queue))
        worker = await eventually(
            lambda: get(live, "deployment", "orders-worker-emails"), within=60, interval=0.5
        )
    pod = worker["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "emails-handler"
    assert pod["tolerations"] == settings["tolerations"]
    assert pod["nodeSelector"] == {"pool": "q"}
    assert {"name": "APP_MODE", "value": "prod"} in pod["containers"][0]["env"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert worker["spec"]["template"]["metadata"]["labels"]["team"] == "mail"


async def test_operator_metrics_follow_reconciles_and_the_autoscaler(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    async with running_live_operator(live) as operator:
        queue = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1}
        await asyncio.to_thread(live.apply, body(live, queue))
        registry = operator.metrics.registry
        labels = {"namespace": live.name, "dispatcher": NAME, "queue": "emails"}

        async def measured() -> bool:
            applied = registry.get_sample_value(
                "dispatcher_operator_reconciles_total", {"outcome": "applied"}
            )
            replicas = registry.get_sample_value("dispatcher_operator_queue_replicas", labels)
            backlog = registry.get_sample_value("dispatcher_operator_queue_backlog", labels)
            return bool(applied) and replicas == 1 and backlog == 0

        await eventually(measured, within=60, interval=0.5)
        assert registry.get_sample_value("dispatcher_operator_reconcile_seconds_count")
        ticks = {"outcome": "ok"}
        assert registry.get_sample_value("dispatcher_operator_autoscale_ticks_total", ticks)
