"""The operator's platform duties on kmock: migrations first, per-role Secrets, budgets, probes.

The real operator (``tests.fix_kube``) against kmock and the machine's Redis. kmock has no Job
controller: ``KubeEmulator.job_outcome`` plays it (``None`` leaves a Job running until the test
writes its status, as the Job controller would).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kmock
import kubernetes_validate
import pytest

from controller.identity import Owner, migration_job_name
from controller.operator import Operator
from dispatcher._testing.servers import free_port
from dispatcher._testing.waiting import eventually
from dispatcher.redis_client import RedisClient
from dispatcher.stream.naming import SHARDS_KEY
from tests.fix_kube import (
    CR_RESOURCE,
    DEPLOYMENTS,
    JOBS,
    NAMESPACE,
    FakeClock,
    KubeEmulator,
    _declare_resources,
    condition_of,
    dispatcher,
    job_status,
    post_secrets,
    running_operator,
    status_of,
)

CR_URL = f"/apis/dispatch.composer.dev/v1alpha1/namespaces/{NAMESPACE}/outboxdispatchers"
SECRETS_URL = f"/api/v1/namespaces/{NAMESPACE}/secrets"
JOBS_URL = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
NAME = "orders"
K8S_VERSION = "1.37.0"
ENQUEUER_V1 = "reg.example.com/enq:1.0"


def _cr(**spec: Any) -> dict[str, Any]:
    """``dispatcher()`` with a migration Secret, a pinned enqueuer image and a one-replica queue."""
    postgres = {
        "secretRef": {"name": "pg", "key": "url"},
        "migrationSecretRef": {"name": "pg-owner", "key": "url"},
    }
    queues = [
        {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5},
        {"name": "single", "handler": "app.tasks:one", "minReplicas": 1, "maxReplicas": 1},
    ]
    defaults = {"postgres": postgres, "enqueuer": {"image": ENQUEUER_V1}, "queues": queues}
    return dispatcher(**{**defaults, **spec})


def _image(kube: KubeEmulator, name: str) -> str | None:
    found = kube.live(DEPLOYMENTS, name)
    return None if found is None else found["spec"]["template"]["spec"]["containers"][0]["image"]


def _owner(kube: KubeEmulator) -> Owner:
    cr = kube.live(CR_RESOURCE, NAME)
    assert cr is not None
    return Owner(name=NAME, namespace=NAMESPACE, uid=cr["metadata"]["uid"])


async def _finish_job(kube: KubeEmulator, name: str, outcome: str = "Complete") -> None:
    """What the Job controller does when the migration pod exits."""
    await kube.send("patch", f"{JOBS_URL}/{name}/status", {"status": job_status(outcome)})


async def test_migration_job_runs_before_the_enqueuer_starts_or_upgrades(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    kube.job_outcome = None  # Jobs run until this test finishes them
    await post_secrets(
        kube, pg="postgresql://app@db/app", pg_owner="postgresql://owner@db/app", rd=redis_url
    )
    await kube.send("post", CR_URL, _cr())
    first = migration_job_name(_owner(kube), ENQUEUER_V1)

    async def migrating() -> bool:
        return condition_of(kube, "Migrated") == ("False", "Running") and bool(
            kube.live(DEPLOYMENTS, "orders-worker-emails")
        )

    await eventually(migrating, within=20)
    assert kube.live(DEPLOYMENTS, "orders-enqueuer") is None  # not before the schema exists
    job = kube.live(JOBS, first)
    assert job is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["args"]) == (ENQUEUER_V1, ["migrate"])
    env = {e["name"]: e for e in container["env"]}
    assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "pg-owner", "key": "url"}}
    assert job["metadata"]["ownerReferences"][0]["uid"] == _owner(kube).uid
    assert kubernetes_validate.validate(job, K8S_VERSION, strict=True)

    await _finish_job(kube, first)

    async def started() -> bool:
        return _image(kube, "orders-enqueuer") == ENQUEUER_V1 and (
            condition_of(kube, "Migrated") == ("True", "Succeeded")
        )

    await eventually(started, within=20)
    assert status_of(kube).migrated_image == ENQUEUER_V1

    # A new image migrates again; the running enqueuer keeps the old one until then.
    upgraded = "reg.example.com/enq:2.0"
    await kube.send("patch", f"{CR_URL}/{NAME}", {"spec": {"enqueuer": {"image": upgraded}}})
    second = migration_job_name(_owner(kube), upgraded)

    async def second_job() -> bool:
        return kube.live(JOBS, second) is not None and condition_of(kube, "Migrated") == (
            "False",
            "Running",
        )

    await eventually(second_job, within=20)
    assert _image(kube, "orders-enqueuer") == ENQUEUER_V1
    await _finish_job(kube, second)

    async def upgraded_enqueuer() -> bool:
        return _image(kube, "orders-enqueuer") == upgraded and (
            status_of(kube).migrated_image == upgraded
        )

    await eventually(upgraded_enqueuer, within=20)


async def test_failed_migration_is_a_condition_and_a_warning_and_the_enqueuer_waits(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    kube.job_outcome = "Failed"
    await post_secrets(
        kube, pg="postgresql://app@db/app", pg_owner="postgresql://owner@db/app", rd=redis_url
    )
    await kube.send("post", CR_URL, _cr())

    async def failed() -> bool:
        return condition_of(kube, "Migrated") == ("False", "MigrationFailed") and bool(
            kube.events("MigrationFailed")
        )

    await eventually(failed, within=20)
    found = status_of(kube).condition("Migrated")
    assert found is not None
    assert "backoff limit" in found.message
    assert "kubectl delete job" in found.message
    assert kube.live(DEPLOYMENTS, "orders-enqueuer") is None
    assert kube.live(DEPLOYMENTS, "orders-worker-emails") is not None


async def test_migrate_false_runs_no_job(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await post_secrets(kube, pg="postgresql://app@db/app", rd=redis_url)
    cr = _cr(migrate=False)
    cr["spec"]["postgres"].pop("migrationSecretRef")  # not needed, not checked
    await kube.send("post", CR_URL, cr)

    async def applied() -> bool:
        return _image(kube, "orders-enqueuer") == ENQUEUER_V1 and condition_of(
            kube, "Migrated"
        ) == (
            "Unknown",
            "Disabled",
        )

    await eventually(applied, within=20)
    assert kube.all(JOBS) == []


async def test_each_role_uses_its_own_redis_secret(
    kube: KubeEmulator, operator: Operator, redis_url: str, redis_standalone: RedisClient
) -> None:
    # Only the operator's Secret holds a reachable URL: the shard key proves the operator used it.
    await post_secrets(
        kube,
        pg="postgresql://app@db/app",
        pg_owner="postgresql://owner@db/app",
        rd_enqueuer="redis://dispatcher-enqueuer:pw@redis:6379/0",
        rd_operator=redis_url,
    )
    redis = {
        "enqueuerSecretRef": {"name": "rd-enqueuer", "key": "url"},
        "workerSecretRef": {"name": "rd-worker", "key": "url"},
        "operatorSecretRef": {"name": "rd-operator", "key": "url"},
    }
    await kube.send("post", CR_URL, _cr(redis=redis))

    async def missing() -> bool:
        found = status_of(kube).condition("Degraded")
        return (
            found is not None and found.reason == "SecretMissing" and "rd-worker" in found.message
        )

    await eventually(missing, within=20)
    assert kube.live(DEPLOYMENTS, "orders-worker-emails") is None
    await post_secrets(kube, rd_worker="redis://dispatcher-worker:pw@redis:6379/0")

    async def applied() -> bool:  # one pass creates them one after the other
        names = ("orders-enqueuer", "orders-worker-emails")
        return all(kube.live(DEPLOYMENTS, name) is not None for name in names)

    await eventually(applied, within=20)

    def redis_ref(name: str) -> Any:
        deployment = kube.live(DEPLOYMENTS, name)
        assert deployment is not None
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == "REDIS_URL")

    assert redis_ref("orders-enqueuer") == {"name": "rd-enqueuer", "key": "url"}
    assert redis_ref("orders-worker-emails") == {"name": "rd-worker", "key": "url"}
    assert await redis_standalone.get(SHARDS_KEY) == "2"
    assert redis_url not in repr(kube.all("v1/events"))


async def test_pod_settings_reach_the_deployments(
    kube: KubeEmulator, operator: Operator, redis_url: str
) -> None:
    await post_secrets(
        kube, pg="postgresql://app@db/app", pg_owner="postgresql://owner@db/app", rd=redis_url
    )
    settings = {
        "env": [{"name": "APP_MODE", "value": "prod"}],
        "serviceAccountName": "emails-handler",
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "q", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "q"},
        "podLabels": {"team": "mail"},
    }
    queues = [{"name": "emails", "handler": "app.tasks:send", **settings}]
    await kube.send("post", CR_URL, _cr(queues=queues))

    async def applied() -> bool:
        return kube.live(DEPLOYMENTS, "orders-worker-emails") is not None

    await eventually(applied, within=20)
    worker = kube.live(DEPLOYMENTS, "orders-worker-emails")
    assert worker is not None
    pod = worker["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "emails-handler"
    assert pod["tolerations"] == settings["tolerations"]
    assert pod["nodeSelector"] == {"pool": "q"}
    assert {"name": "APP_MODE", "value": "prod"} in pod["containers"][0]["env"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert worker["spec"]["template"]["metadata"]["labels"]["team"] == "mail"
    assert kubernetes_validate.validate(worker, K8S_VERSION, strict=True)


async def test_operator_metrics_follow_reconciles_and_the_autoscaler(
    kube: KubeEmulator, operator: Operator, redis_url: str, clock: FakeClock
) -> None:
    await post_secrets(
        kube, pg="postgresql://app@db/app", pg_owner="postgresql://owner@db/app", rd=redis_url
    )
    await kube.send("post", CR_URL, _cr())
    registry = operator.metrics.registry
    labels = {"namespace": NAMESPACE, "dispatcher": NAME, "queue": "emails"}

    async def measured() -> bool:
        applied = registry.get_sample_value(
            "dispatcher_operator_reconciles_total", {"outcome": "applied"}
        )
        replicas = registry.get_sample_value("dispatcher_operator_queue_replicas", labels)
        backlog = registry.get_sample_value("dispatcher_operator_queue_backlog", labels)
        return bool(applied) and replicas == 1 and backlog == 0

    await eventually(measured, within=20)
    assert registry.get_sample_value("dispatcher_operator_reconcile_seconds_count")
    assert registry.get_sample_value("dispatcher_operator_autoscale_ticks_total", {"outcome": "ok"})


async def _healthz(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


async def test_liveness_is_green_when_the_crd_is_served(
    kube: KubeEmulator, clock: FakeClock
) -> None:
    url = f"http://127.0.0.1:{free_port()}/healthz"
    async with running_operator(kube, clock, liveness=url):
        assert await _healthz(url) == 200


@pytest.fixture
async def kube_without_crd() -> Any:
    """An API where the CRD is not established yet (its resource is not discoverable)."""
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        _declare_resources(emulator)
        del emulator.resources[CR_RESOURCE]
        yield emulator


async def test_liveness_fails_when_the_operator_started_before_its_crd(
    kube_without_crd: KubeEmulator, clock: FakeClock
) -> None:
    url = f"http://127.0.0.1:{free_port()}/healthz"
    async with running_operator(kube_without_crd, clock, liveness=url):
        assert await _healthz(url) == 500
        # The CRD appears later: kopf (scanning off) still watches nothing, so stay red.
        _declare_resources(kube_without_crd)
        assert await _healthz(url) == 500
