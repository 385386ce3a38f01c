"""The operator through a dispatcher's whole life: uninstall, drift, availability, queue removal,
Secret rotation, upgrades, and the API writes it must not make.

Same setting as ``test_operator``: the real kopf operator against kmock, the machine's Redis and
PostgreSQL. kmock plays the Deployment controller too (``KubeEmulator.stalled`` holds rollouts
back), so ``Ready`` and ``Progressing`` can be seen to follow the Deployments.
"""

from __future__ import annotations

from typing import Any

from controller.operator import Operator
from dispatcher._testing.waiting import eventually
from dispatcher.redis_client import RedisClient
from tests.fix_kube import (
    CR_RESOURCE,
    CR_URL,
    DEPLOYMENTS,
    NAME,
    NAMESPACE,
    SECRETS_URL,
    FakeClock,
    KubeEmulator,
    dispatcher,
    post_secrets,
    running_operator,
    secret,
)

DEPLOYMENTS_URL = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
WORKERS = ("orders-worker-emails", "orders-worker-invoices")
ALL = ("orders-enqueuer", *WORKERS)
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def _status(kube: KubeEmulator, name: str = NAME) -> dict[str, Any]:
    status: dict[str, Any] = (kube.live(CR_RESOURCE, name) or {}).get("status") or {}
    return status


def _condition(kube: KubeEmulator, type_: str, name: str = NAME) -> dict[str, Any]:
    found = [c for c in _status(kube, name).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else {}


def _is(kube: KubeEmulator, type_: str, status: str, reason: str, name: str = NAME) -> bool:
    found = _condition(kube, type_, name)
    return (found.get("status"), found.get("reason")) == (status, reason)


def _template_annotations(kube: KubeEmulator, name: str) -> dict[str, str]:
    found = kube.live(DEPLOYMENTS, name) or {}
    annotations: dict[str, str] = found["spec"]["template"]["metadata"]["annotations"]
    return annotations


def _args(kube: KubeEmulator, name: str) -> list[str]:
    found = kube.live(DEPLOYMENTS, name) or {}
    args: list[str] = found["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


async def _deploy(kube: KubeEmulator, redis_url: str, **spec: Any) -> None:
    """The Secrets and a dispatcher (``dispatcher(**spec)``), once the operator made it Ready."""
    await post_secrets(kube, redis_url)
    await kube.send("post", CR_URL, dispatcher(**spec))
    await _ready(kube)


async def _ready(kube: KubeEmulator, name: str = NAME) -> None:
    async def check() -> bool:
        return _is(kube, "Ready", "True", "Reconciled", name)

    await eventually(check, within=20)


async def test_ready_follows_the_deployments_and_progressing_their_rollouts(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await post_secrets(kube, redis_url)
    kube.stalled.add("orders-worker-emails")  # e.g. ImagePullBackOff: no pod ever available
    await kube.send("post", CR_URL, dispatcher())

    async def unavailable() -> bool:
        return (
            _is(kube, "Ready", "False", "DeploymentsUnavailable")
            and _is(kube, "Progressing", "True", "RollingOut")
            and _is(kube, "Degraded", "False", "AsExpected")
        )

    await eventually(unavailable, within=20)
    assert "orders-worker-emails" in _condition(kube, "Ready")["message"]
    assert "orders-enqueuer" not in _condition(kube, "Ready")["message"]
    assert _status(kube)["observedGeneration"] == 1

    # The Deployment controller catches up: the pods of the current generation are available.
    live = kube.live(DEPLOYMENTS, "orders-worker-emails") or {}
    status = {
        "observedGeneration": live["metadata"]["generation"],
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
    }
    await kube.send("patch", f"{DEPLOYMENTS_URL}/orders-worker-emails/status", {"status": status})

    async def available() -> bool:
        return _is(kube, "Ready", "True", "Reconciled") and _is(
            kube, "Progressing", "False", "RolloutComplete"
        )

    await eventually(available, within=10)


async def test_unreachable_redis_or_postgres_is_degraded_and_not_ready(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await _deploy(kube, redis_url)

    down = secret("rd", url="redis://:hunter2@127.0.0.1:1/0")
    await kube.send("patch", f"{SECRETS_URL}/rd", {"data": down["data"]})

    async def redis_down() -> bool:
        return _is(kube, "Degraded", "True", "RedisUnavailable") and _is(
            kube, "Ready", "False", "RedisUnavailable"
        )

    await eventually(redis_down, within=15)
    await kube.send("patch", f"{SECRETS_URL}/rd", {"data": secret("rd", url=redis_url)["data"]})
    await _ready(kube)

    down = secret("pg", url="postgresql://app:hunter2@127.0.0.1:1/app")
    await kube.send("patch", f"{SECRETS_URL}/pg", {"data": down["data"]})

    async def postgres_down() -> bool:
        return _is(kube, "Degraded", "True", "PostgresUnavailable") and _is(
            kube, "Ready", "False", "PostgresUnavailable"
        )

    await eventually(postgres_down, within=15)
    degraded = _condition(kube, "Degraded")
    assert "127.0.0.1:1" in degraded["message"]
    assert "hunter2" not in repr(_status(kube)) + repr(kube.all("v1/events"))
    assert degraded["observedGeneration"] == _status(kube)["observedGeneration"] == 1


async def test_a_removed_queue_keeps_its_workers_until_its_streams_are_drained(
    kube: KubeEmulator, operator: Operator, redis_url: str, redis_standalone: RedisClient
) -> None:
    await _deploy(kube, redis_url)
    await redis_standalone.xadd("workflow.tasks.invoices.1", {"task_id": "t1"})
    await redis_standalone.xgroup_create("workflow.tasks.invoices.1", "workers", id="0")
    await redis_standalone.xreadgroup("workers", "w1", {"workflow.tasks.invoices.1": ">"}, count=1)

    emails = dispatcher()["spec"]["queues"][:1]
    await kube.send("patch", f"{CR_URL}/{NAME}", {"spec": {"queues": emails}})

    async def draining() -> bool:
        replicas = (kube.live(DEPLOYMENTS, "orders-worker-invoices") or {}).get("spec", {})
        return _is(kube, "QueuesDraining", "True", "Draining") and replicas.get("replicas") == 1

    await eventually(draining, within=15)  # minReplicas was 0: one worker runs to drain it
    assert "invoices" in _condition(kube, "QueuesDraining")["message"]

    stream = "workflow.tasks.invoices.1"
    (entry,) = [e[0] for e in await redis_standalone.xrange(stream)]
    await redis_standalone.xdel(stream, entry)  # no entry left, but one delivered and not acked

    async def still_pending() -> bool:
        message = _condition(kube, "QueuesDraining").get("message", "")
        return "invoices: 0 entries, 1 pending" in message

    await eventually(still_pending, within=15)
    assert kube.live(DEPLOYMENTS, "orders-worker-invoices") is not None

    await redis_standalone.xack(stream, "workers", entry)  # acked: drained

    async def deleted() -> bool:
        return kube.live(DEPLOYMENTS, "orders-worker-invoices") is None and _is(
            kube, "QueuesDraining", "False", "Drained"
        )

    await eventually(deleted, within=15)


async def test_workload_images_follow_the_operator_unless_the_spec_pins_them(
    kube: KubeEmulator, redis_url: str, clock: FakeClock
) -> None:
    await post_secrets(kube, redis_url)
    queues = dispatcher()["spec"]["queues"]
    queues[1]["image"] = "registry.example.com/billing:7"
    await kube.send("post", CR_URL, dispatcher(queues=queues))

    def image(name: str) -> str:
        found = kube.live(DEPLOYMENTS, name) or {}
        return str(found["spec"]["template"]["spec"]["containers"][0]["image"])

    old = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.0", "worker_image": "reg/w:1.0"}
    async with running_operator(kube, clock, **old):
        await _ready(kube)
    assert image("orders-enqueuer") == "reg/outbox-dispatcher-enqueuer:1.0"
    assert image("orders-worker-emails") == "reg/w:1.0"

    new = {"enqueuer_image": "reg/outbox-dispatcher-enqueuer:1.1", "worker_image": "reg/w:1.1"}
    async with running_operator(kube, clock, **new):

        async def upgraded() -> bool:
            return image("orders-enqueuer").endswith(":1.1") and image(
                "orders-worker-emails"
            ).endswith(":1.1")

        await eventually(upgraded, within=15)
    assert image("orders-worker-invoices") == "registry.example.com/billing:7"
