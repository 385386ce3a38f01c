"""What the operator writes for a dispatcher: its Deployments and budgets, as the spec says.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.

- Applying a dispatcher creates the enqueuer and one worker per queue (command, Secret
  references, labels, owner, a restricted security context; no secret value anywhere);
  every Deployment passes ``kubernetes_validate`` strictly.
- A spec change reaches the Deployments (handler, concurrency, the enqueuer's batch size),
  and a removed queue's worker Deployment goes once its (empty) streams are drained.
- Budgets: the enqueuer's and each multi-replica queue's; lowering a queue to one replica
  drops its budget.
- Pod settings of a queue (env, service account, tolerations, node selector, labels)
  reach its Deployment.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes_validate
import pytest

from dispatcher.stream.naming import SHARDS_KEY
from tests.e2e.live_dispatcher import (
    NAME,
    WORKERS,
    body,
    container,
    deployment,
    get,
    idle,
    replicas,
    settled,
    status_of,
    until,
)
from tests.fix_live_operator import LiveNamespace, running_live_operator

pytestmark = pytest.mark.timeout(600)


def args(workload: dict[str, Any] | None) -> list[str]:
    return list(container(workload).get("args") or [])


async def test_apply_creates_enqueuer_and_one_worker_per_queue(
    live_namespace: LiveNamespace, redis_url: str, live_redis: Any
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

        assert await live_redis.get(SHARDS_KEY) == "2"
        status = await status_of(live)
        assert (status.shards, status.observed_generation) == (2, 1)
        ready = status.condition("Ready")
        assert ready is not None
        assert ready.last_transition_time is not None
        assert ready.observed_generation == 1
        listed = await asyncio.to_thread(live.kubectl, "get", "events,deployments", "-o", "json")
        assert redis_url not in listed  # no secret in any Event or Deployment


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


async def test_a_spec_change_reaches_the_deployments_and_a_removed_queue_goes(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    invoices = {"name": "invoices", "handler": "billing:render"}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, emails, invoices))
        await until(lambda: get(live, "deployment", "orders-worker-invoices"))
        changed = {**emails, "handler": "app.tasks:send_v2", "concurrency": 32}
        spec = idle(live, changed, enqueuer={"replicas": 0, "batchSize": 200})
        await asyncio.to_thread(live.apply, spec)

        async def applied() -> bool:
            worker = await get(live, "deployment", "orders-worker-emails")
            gone = await get(live, "deployment", "orders-worker-invoices")
            return "--handler=app.tasks:send_v2" in args(worker) and gone is None

        await until(applied)
        assert "--concurrency=32" in args(await get(live, "deployment", "orders-worker-emails"))
        assert "--batch-size=200" in args(await get(live, "deployment", "orders-enqueuer"))

        async def observed() -> bool:
            cr = await get(live, "obd", "orders") or {}
            return (cr.get("status") or {}).get("observedGeneration") == 2

        await until(observed)


async def test_budgets_for_the_enqueuer_and_multi_replica_queues(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    single = {"name": "single", "handler": "app.tasks:one", "maxReplicas": 1}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, emails, single))

        async def budgets() -> bool:
            return bool(await get(live, "pdb", "orders-enqueuer")) and bool(
                await get(live, "pdb", "orders-worker-emails")
            )

        await until(budgets)
        assert await get(live, "pdb", "orders-worker-single") is None  # one replica: no budget
        listed = await asyncio.to_thread(live.kubectl, "get", "pdb", "-o", "json")
        assert {b["spec"]["maxUnavailable"] for b in json.loads(listed)["items"]} == {1}
        # Lowering a queue to one replica drops its budget (a drain must be able to move it).
        await asyncio.to_thread(live.apply, idle(live, {**emails, "maxReplicas": 1}))

        async def dropped() -> bool:
            return await get(live, "pdb", "orders-worker-emails") is None

        await until(dropped)
        assert await get(live, "pdb", "orders-enqueuer") is not None


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
        await asyncio.to_thread(live.apply, idle(live, queue))
        worker = await until(lambda: get(live, "deployment", "orders-worker-emails"))
    pod = worker["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "emails-handler"
    assert pod["tolerations"] == settings["tolerations"]
    assert pod["nodeSelector"] == {"pool": "q"}
    assert {"name": "APP_MODE", "value": "prod"} in pod["containers"][0]["env"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert worker["spec"]["template"]["metadata"]["labels"]["team"] == "mail"
