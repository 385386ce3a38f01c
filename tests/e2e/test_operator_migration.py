"""The migration Job: the Job controller and the node run ``dispatcher migrate`` from the
enqueuer image (a real one, against a database of ``cluster_postgres`` the Pods reach)
before the enqueuer starts or moves to a new image, or fail it up to the Job's backoff
limit (a condition and a warning; the enqueuer waits); ``migrate: false`` runs none.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says,
here with its migration (``migrating()``: the enqueuer image under names the node was given).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatcher.controller.identity import Owner, migration_job_name
from dispatcher.controller.model import DEFAULT_VERSION_TAG
from dispatcher.demo.throwaway import PostgresProcess
from tests.e2e.live_dispatcher import NAME, condition, container, events, get, idle, shows, until
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.waiting import eventually
from tools.cluster import HOST_IP, Cluster

pytestmark = pytest.mark.timeout(600)

ENQUEUER_V1 = "reg.example.com/enq:1.0"
UPGRADED = "reg.example.com/enq:2.0"


@pytest.fixture(scope="module", autouse=True)
def enqueuer_versions(cluster: Cluster) -> None:
    """The node has the enqueuer image under the two names these tests upgrade between (it
    pulls nothing: a name it lacks would never run)."""
    for name in (ENQUEUER_V1, UPGRADED):
        cluster.tag_image(
            f"docker.io/library/outbox-dispatcher-enqueuer:{DEFAULT_VERSION_TAG}", name
        )


def migrating(live: LiveNamespace, image: str = ENQUEUER_V1, **spec: Any) -> dict[str, Any]:
    """``idle()`` that migrates with the ``pg-owner`` Secret before its enqueuer runs ``image``."""
    postgres = {
        "secretRef": {"name": "pg", "key": "url"},
        "migrationSecretRef": {"name": "pg-owner", "key": "url"},
    }
    enqueuer = {"image": image, "replicas": 0}
    return idle(live, migrate=True, postgres=postgres, enqueuer=enqueuer, **spec)


def owner_of(live: LiveNamespace) -> Owner:
    return Owner(name=NAME, namespace=live.name, uid="")  # the Job's name needs no uid


def finished(job: dict[str, Any] | None, outcome: str) -> bool:
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == outcome and c["status"] == "True" for c in conditions)


async def test_migration_job_runs_before_the_enqueuer_starts_or_upgrades(
    live_namespace: LiveNamespace, cluster_postgres: PostgresProcess
) -> None:
    """The Job controller and the kubelet run ``dispatcher migrate`` (a real one, on a
    database the Pods reach); the enqueuer Deployment never shows an image whose Job has not
    completed (it is read before the Job, so a completion cannot be missed)."""
    live = live_namespace
    url = cluster_postgres.create_database("migrate").replace("127.0.0.1", HOST_IP)
    await asyncio.to_thread(live.secret, "pg-owner", url)

    async def migrated_then_started(image: str) -> bool:
        enqueuer = await get(live, "deployment", "orders-enqueuer")
        job = await get(live, "job", migration_job_name(owner_of(live), image))
        if container(enqueuer).get("image") != image:
            return False
        assert finished(job, "Complete"), f"the enqueuer runs {image} before it was migrated"
        return await shows(live, "Migrated", "True", "Succeeded")

    async with running_live_operator(live, migration_poll=0.5):
        await asyncio.to_thread(live.apply, migrating(live))
        name = migration_job_name(owner_of(live), ENQUEUER_V1)
        job = await eventually(lambda: get(live, "job", name), within=60, interval=0.2)
        migrate = container({"spec": job["spec"]})
        assert (migrate["image"], migrate["args"]) == (ENQUEUER_V1, ["migrate"])
        env = {e["name"]: e for e in migrate["env"]}
        assert env["DATABASE_URL"]["valueFrom"] == {
            "secretKeyRef": {"name": "pg-owner", "key": "url"}
        }
        cr = await get(live, "obd", NAME) or {}
        assert job["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
        await eventually(lambda: migrated_then_started(ENQUEUER_V1), within=180, interval=0.2)
        cr = await get(live, "obd", NAME) or {}
        assert cr["status"]["migratedImage"] == ENQUEUER_V1
        # A new image migrates again; the running enqueuer keeps the old one until then.
        upgraded = UPGRADED
        await asyncio.to_thread(live.apply, migrating(live, upgraded))
        await eventually(lambda: migrated_then_started(upgraded), within=180, interval=0.2)
        cr = await get(live, "obd", NAME) or {}
        assert cr["status"]["migratedImage"] == upgraded


async def test_failed_migration_is_a_condition_and_a_warning_and_the_enqueuer_waits(
    live_namespace: LiveNamespace,
) -> None:
    """``dispatcher migrate`` cannot connect: its pods fail until the Job controller gives up
    (``backoffLimit``), and the operator reports it and keeps the enqueuer back."""
    live = live_namespace
    await asyncio.to_thread(live.secret, "pg-owner", f"postgresql://owner@{HOST_IP}:1/app")
    async with running_live_operator(live, migration_poll=0.5):
        await asyncio.to_thread(live.apply, migrating(live))

        async def failed() -> bool:
            return await shows(live, "Migrated", "False", "MigrationFailed") and (
                bool(await events(live, "MigrationFailed"))
            )

        await eventually(failed, within=500, interval=2)
        message = (await condition(live, "Migrated"))["message"]
        assert "backoff limit" in message
        assert "kubectl delete job" in message
        assert await get(live, "deployment", "orders-enqueuer") is None
        assert await get(live, "deployment", "orders-worker-emails") is not None


async def test_migrate_false_runs_no_job(live_namespace: LiveNamespace) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, enqueuer={"image": ENQUEUER_V1}))

        async def applied() -> bool:
            found = container(await get(live, "deployment", "orders-enqueuer"))
            return found.get("image") == ENQUEUER_V1 and await shows(
                live, "Migrated", "Unknown", "Disabled"
            )

        await until(applied)
    listed = await asyncio.to_thread(live.kubectl, "get", "jobs", "-o", "json")
    assert json.loads(listed)["items"] == []
