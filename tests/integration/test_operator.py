"""The kopf operator end to end: kmock as the Kubernetes API, the machine's Redis.

Each test runs the real operator (``tests.fix_kube.operator``) in its own
loop, applies ``OutboxDispatcher`` resources through the API, and polls the
API and Redis for the outcome with a deadline, never a guessed sleep. The
autoscaler's stabilization window runs on an injected clock.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import redis.asyncio

from controller.operator import Operator
from dispatcher._testing.waiting import eventually
from dispatcher.stream.naming import SHARDS_KEY
from tests.fix_kube import (
    CR_URL,
    DEPLOYMENTS,
    NAME,
    NAMESPACE,
    SECRETS_URL,
    FakeClock,
    KubeEmulator,
    condition_of,
    dispatcher,
    post_secrets,
    running_operator,
    secret,
    status_of,
)


async def _apply(kube: KubeEmulator, body: dict[str, Any]) -> dict[str, Any]:
    return await kube.send("post", CR_URL, body)


async def _patch_spec(kube: KubeEmulator, spec: dict[str, Any]) -> None:
    await kube.send("patch", f"{CR_URL}/{NAME}", {"spec": spec})


def _deployment(kube: KubeEmulator, name: str) -> dict[str, Any]:
    found = kube.live(DEPLOYMENTS, name)
    assert found is not None, f"no Deployment {name}"
    return found


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _replicas(kube: KubeEmulator, name: str) -> int | None:
    found = kube.live(DEPLOYMENTS, name)
    return None if found is None else int(found["spec"]["replicas"])


async def _has_event(kube: KubeEmulator, reason: str) -> None:
    """Events are posted in the background: wait for one with ``reason``."""

    async def posted() -> bool:
        return bool(kube.events(reason))

    await eventually(posted, within=10)


async def _ready(kube: KubeEmulator) -> None:
    async def check() -> bool:
        return (
            condition_of(kube, "Ready") == ("True", "Reconciled")
            and bool(kube.live(DEPLOYMENTS, "orders-worker-invoices"))
            and bool(kube.live(DEPLOYMENTS, "orders-enqueuer"))
        )

    await eventually(check, within=20)


@pytest.fixture
async def client(redis_url: str) -> Any:
    conn = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    await conn.aclose()


async def test_apply_creates_enqueuer_and_one_worker_per_queue(
    kube: KubeEmulator, operator: Operator, redis_url: str, client: Any
) -> None:
    await post_secrets(kube, redis_url)
    cr = await _apply(kube, dispatcher())
    await _ready(kube)

    enqueuer = _deployment(kube, "orders-enqueuer")
    assert _container(enqueuer)["command"] == ["dispatcher"]
    assert _container(enqueuer)["args"][0] == "enqueuer"
    env = {e["name"]: e for e in _container(enqueuer)["env"]}
    assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "pg", "key": "url"}}
    assert env["REDIS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "rd", "key": "url"}}
    assert "STREAM_SHARDS" not in env  # the shard count is read live from Redis
    for name, queue in (("orders-worker-emails", "emails"), ("orders-worker-invoices", "invoices")):
        worker = _deployment(kube, name)
        assert _container(worker)["args"][:2] == ["worker", f"--queue={queue}"]
        labels = worker["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == NAME
        assert labels["app.kubernetes.io/component"] == "worker"
        assert labels["app.kubernetes.io/managed-by"] == "outbox-dispatcher-operator"
        owner = worker["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "OutboxDispatcher",
            NAME,
            cr["metadata"]["uid"],
        )
        assert owner["controller"] is True
        security = _container(worker)["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
        assert "value" not in {e["name"]: e for e in _container(worker)["env"]}["REDIS_URL"]
    assert _replicas(kube, "orders-worker-emails") == 1
    assert _replicas(kube, "orders-worker-invoices") == 0

    assert await client.get(SHARDS_KEY) == "2"
    status = status_of(kube)
    assert status.shards == 2
    assert status.observed_generation == 1
    assert condition_of(kube, "Degraded") == ("False", "AsExpected")
    ready = status.condition("Ready")
    assert ready is not None
    assert ready.last_transition_time is not None
    assert ready.observed_generation == 1
    assert redis_url not in repr(kube.all("v1/events"))  # no secret in any event


def _templates(kube: KubeEmulator) -> dict[str, Any]:
    names = ("orders-enqueuer", "orders-worker-emails", "orders-worker-invoices")
    return {name: copy.deepcopy(_deployment(kube, name)["spec"]["template"]) for name in names}


async def test_shard_count_changes_restart_no_pod_and_a_decrease_reports_draining(
    kube: KubeEmulator, operator: Operator, redis_url: str, client: Any
) -> None:
    await post_secrets(kube, redis_url)
    await _apply(kube, dispatcher(shards=4))
    await _ready(kube)
    assert await client.get(SHARDS_KEY) == "4"
    templates = _templates(kube)
    for template in templates.values():
        env = {e["name"] for e in template["spec"]["containers"][0]["env"]}
        assert "STREAM_SHARDS" not in env  # processes read the key live

    await _patch_spec(kube, {"shards": 8})  # raising: immediate

    async def raised() -> bool:
        return await client.get(SHARDS_KEY) == "8" and status_of(kube).shards == 8

    await eventually(raised, within=15)
    assert _templates(kube) == templates

    # Shard 6 holds one entry and one delivered-unacked entry when the count drops to 2.
    old = "workflow.tasks.emails.6"
    await client.xgroup_create(old, "workers", id="0", mkstream=True)
    await client.xadd(old, {"task_id": "t1"})
    await client.xadd(old, {"task_id": "t2"})
    ((_, ((held, _),)),) = await client.xreadgroup("workers", "w1", {old: ">"}, count=1)
    await _patch_spec(kube, {"shards": 2})

    async def draining() -> bool:
        return (
            await client.get(SHARDS_KEY) == "2"  # in force at once: publishing moves now
            and status_of(kube).shards == 2
            and condition_of(kube, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")
        )

    await eventually(draining, within=15)
    condition = status_of(kube).condition("ShardsDraining")
    assert condition is not None
    assert f"{old} (length 2, pending 1)" in condition.message
    assert condition_of(kube, "Degraded") == ("False", "AsExpected")
    assert _templates(kube) == templates  # no worker restarted by the decrease

    (rest,) = [i for i, _ in await client.xrange(old) if i != held]
    await client.xdel(old, rest)
    await client.xdel(old, held)  # no entries left, but one still pending: still draining

    async def pending_only() -> bool:
        found = status_of(kube).condition("ShardsDraining")
        return found is not None and f"{old} (length 0, pending 1)" in found.message

    await eventually(pending_only, within=15)
    assert condition_of(kube, "ShardsDraining") == ("True", "RemovedShardsNotEmpty")

    await client.xack(old, "workers", held)  # drained

    async def drained() -> bool:
        return condition_of(kube, "ShardsDraining") == ("False", "AsExpected")

    await eventually(drained, within=15)
    assert _templates(kube) == templates


async def test_backlog_scales_up_at_once_and_down_after_stabilization(
    kube: KubeEmulator, operator: Operator, redis_url: str, client: Any, clock: FakeClock
) -> None:
    await post_secrets(kube, redis_url)
    queues = [
        {
            "name": "emails",
            "handler": "app.tasks:send",
            "minReplicas": 1,
            "maxReplicas": 5,
            "targetBacklogPerReplica": 100,
            "scaleDownStabilizationSeconds": 300,
        }
    ]
    await _apply(kube, dispatcher(shards=2, queues=queues))

    async def created() -> bool:
        return _replicas(kube, "orders-worker-emails") == 1

    await eventually(created, within=20)

    # From here on, each step runs one pass itself (besides the operator's own loop): what a
    # pass decides depends on the injected clock and Redis only, never on how long it took.
    key = (NAMESPACE, NAME)
    async with client.pipeline(transaction=True) as burst:  # all at once, as a pass sees it
        for i in range(250):  # 250 entries over both shards -> ceil(250/100) = 3 replicas
            burst.xadd(f"workflow.tasks.emails.{i % 2}", {"task_id": f"t{i}"})
        await burst.execute()
    await operator.sync(key)
    assert _replicas(kube, "orders-worker-emails") == 3
    row = status_of(kube).queue("emails")
    assert row is not None
    assert (row.backlog, row.replicas, row.desired_replicas) == (250, 3, 3)
    assert row.last_scale_time == clock.now

    # A worker took 10 entries and has not acked them yet: pending, still in the backlog.
    await client.xgroup_create("workflow.tasks.emails.0", "workers", id="0")
    await client.xreadgroup("workers", "w1", {"workflow.tasks.emails.0": ">"}, count=10)
    await operator.sync(key)
    row = status_of(kube).queue("emails")
    assert row is not None
    assert (row.pending, row.backlog) == (10, 250)

    await client.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")  # drained
    await operator.sync(key)
    row = status_of(kube).queue("emails")
    assert row is not None
    assert (row.backlog, row.desired_replicas) == (0, 1)
    clock.advance(299)
    await operator.sync(key)
    assert _replicas(kube, "orders-worker-emails") == 3  # still inside the window

    clock.advance(1)
    await operator.sync(key)
    assert _replicas(kube, "orders-worker-emails") == 1
    assert len(kube.events("Scaled")) == 2  # one Event per change


async def test_missing_secret_and_invalid_spec_degrade_without_crashing(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await _apply(kube, dispatcher())

    async def secret_missing() -> bool:
        return condition_of(kube, "Degraded") == ("True", "SecretMissing")

    await eventually(secret_missing, within=15)
    assert condition_of(kube, "Ready") == ("False", "SecretMissing")
    await _has_event(kube, "SecretMissing")
    assert kube.live(DEPLOYMENTS, "orders-enqueuer") is None

    await post_secrets(kube, redis_url)  # retried with backoff: recovers on its own
    await _ready(kube)

    bad = dispatcher()["spec"]
    bad["queues"] = [{"name": "emails", "handler": "m:f", "minReplicas": 4, "maxReplicas": 2}]
    await _patch_spec(kube, bad)  # slips past the schema: kmock does not validate

    async def invalid() -> bool:
        return condition_of(kube, "Degraded") == ("True", "InvalidSpec")

    await eventually(invalid, within=15)
    found = status_of(kube).condition("Degraded")
    assert found is not None
    assert "minReplicas must be <= maxReplicas" in found.message
    await _has_event(kube, "InvalidSpec")


async def test_unreachable_redis_degrades_and_holds_replicas(
    kube: KubeEmulator, operator: Operator, redis_url: str, client: Any, clock: FakeClock
) -> None:
    await post_secrets(kube, redis_url)
    await _apply(kube, dispatcher())
    await _ready(kube)
    for i in range(300):
        await client.xadd(f"workflow.tasks.emails.{i % 2}", {"task_id": f"t{i}"})

    async def scaled_up() -> bool:
        return _replicas(kube, "orders-worker-emails") == 3

    await eventually(scaled_up, within=15)

    # The Secret now points at a port nobody listens on: Redis is unreachable.
    unreachable = secret("rd", url="redis://:hunter2@127.0.0.1:1/0")
    await kube.send("patch", f"{SECRETS_URL}/rd", {"data": unreachable["data"]})

    async def unavailable() -> bool:
        return condition_of(kube, "Degraded") == ("True", "RedisUnavailable")

    await eventually(unavailable, within=15)
    found = status_of(kube).condition("Degraded")
    assert found is not None
    assert "127.0.0.1:1" in found.message
    assert "hunter2" not in repr(kube.all("v1/events")) + found.message
    await _has_event(kube, "RedisUnavailable")

    await client.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")
    clock.advance(3600)  # far past the window: with no backlog known, hold anyway

    async def held() -> bool:
        row = status_of(kube).queue("emails")
        return row is not None and row.backlog is None and row.replicas == 3

    await eventually(held, within=15)
    assert _replicas(kube, "orders-worker-emails") == 3

    await kube.send("patch", f"{SECRETS_URL}/rd", {"data": secret("rd", url=redis_url)["data"]})

    async def recovered() -> bool:
        return condition_of(kube, "Degraded") == ("False", "AsExpected")

    await eventually(recovered, within=15)


async def test_resume_reconciles_resources_that_existed_before_the_operator(
    kube: KubeEmulator, redis_url: str, client: Any, clock: FakeClock
) -> None:
    await post_secrets(kube, redis_url)
    await _apply(kube, dispatcher(shards=3))
    async with running_operator(kube, clock):
        await _ready(kube)
    assert await client.get(SHARDS_KEY) == "3"
    assert _replicas(kube, "orders-worker-emails") == 1


async def test_every_deployment_the_operator_writes_passes_kubernetes_validate(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await post_secrets(kube, redis_url)
    await _apply(kube, dispatcher())
    await _ready(kube)
    deployments = kube.all(DEPLOYMENTS)
    assert len(deployments) == 3
    for deployment in deployments:
        assert kubernetes_validate.validate(deployment, "1.37.0", strict=True)


async def test_a_spec_change_keeps_the_replicas_the_autoscaler_chose(
    kube: KubeEmulator, operator: Operator, redis_url: str, client: Any, clock: FakeClock
) -> None:
    """Reconciling a changed spec re-renders the worker Deployment but never resets the
    replicas the backlog asked for: reconcile and autoscale are one decision."""
    await post_secrets(kube, redis_url)
    queue = {
        "name": "emails",
        "handler": "app.tasks:send",
        "minReplicas": 1,
        "maxReplicas": 5,
        "targetBacklogPerReplica": 100,
    }
    await _apply(kube, dispatcher(shards=2, queues=[queue]))

    async def created() -> bool:
        return _replicas(kube, "orders-worker-emails") == 1

    await eventually(created, within=20)
    async with client.pipeline(transaction=True) as burst:
        for i in range(250):  # ceil(250 / 100) = 3 replicas
            burst.xadd(f"workflow.tasks.emails.{i % 2}", {"task_id": f"t{i}"})
        await burst.execute()
    key = (NAMESPACE, NAME)
    await operator.sync(key)
    assert _replicas(kube, "orders-worker-emails") == 3

    await _patch_spec(kube, {"queues": [{**queue, "handler": "app.tasks:send_v2"}]})
    await operator.sync(key)

    async def rolled() -> bool:
        live = kube.live(DEPLOYMENTS, "orders-worker-emails") or {}
        return (
            "--handler=app.tasks:send_v2"
            in live["spec"]["template"]["spec"]["containers"][0]["args"]
        )

    await eventually(rolled, within=20)
    assert _replicas(kube, "orders-worker-emails") == 3, "the spec change reset the scale"
