"""The operator's Role grants every API call the operator makes, and nothing more.

The real operator runs (in the test's loop, ``tests.fix_live_operator``) as a ServiceAccount
bound to the Role of ``deploy/base/rbac.yaml`` (the chart's Role is the same object: see
``test_deploy_kustomize``), on the real API server, which refuses whatever the Role does not
allow. A scenario that creates, changes and shrinks an ``OutboxDispatcher`` (whose older
operator left a kopf finalizer to release; a second one on the same Redis database makes
the operator read the first one's resource) must then reach its end with nothing refused,
and every verb the Role grants must have been used: the operator's own requests are counted
by its client (``KubeClient.requests``); kopf's are its list and watch of the dispatchers and
the patch that releases the finalizer, which the scenario waits for. A server-side apply
is authorized as ``patch``, and as ``create`` too when the object does not exist yet.

Two grants are kept that this API server cannot show in use: ``update`` on
``outboxdispatchers/finalizers``, which the OwnerReferencesPermissionEnforcement admission
plugin (on by default on OpenShift, off here) demands for ``blockOwnerDeletion``; and ``watch``
and ``list`` of the dispatchers, which are kopf's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.live_dispatcher import get
from tests.fix_live_operator import LiveNamespace, kubeconfig_via, running_live_operator
from tests.operator_kit import dispatcher
from tests.waiting import eventually
from tools.cluster.binaries import ROOT

pytestmark = pytest.mark.timeout(600)

ACCOUNT = "outbox-dispatcher-operator"
KOPFS = {("dispatch.composer.dev/outboxdispatchers", v) for v in ("list", "watch", "patch")}
APPLY = ("patch", "create")
ADMISSION = {("dispatch.composer.dev/outboxdispatchers/finalizers", "update")}


def role_objects(namespace: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "rbac.yaml").read_text())]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
    return docs


def granted(role: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (f"{group}/{resource}", verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


async def test_the_role_grants_exactly_what_the_operator_uses(
    live_namespace: LiveNamespace, tmp_path: Path
) -> None:
    live = live_namespace
    objects = role_objects(live.name)
    await asyncio.to_thread(live.kubectl, "create", "serviceaccount", ACCOUNT)
    await asyncio.to_thread(live.apply, *objects)
    token = (await asyncio.to_thread(live.kubectl, "create", "token", ACCOUNT)).strip()
    kubeconfig = kubeconfig_via(live.cluster, tmp_path / "kubeconfig", token=token)
    emails = {"name": "emails", "handler": "app.tasks:send", "maxReplicas": 5}
    invoices = {"name": "invoices", "handler": "billing:render", "minReplicas": 0}
    older = dispatcher("orders", queues=[emails, invoices], enqueuer={"replicas": 0})
    older["metadata"].update(
        namespace=live.name, finalizers=["kopf.zalando.org/KopfFinalizerMarker"]
    )
    async with running_live_operator(live, kubeconfig=kubeconfig) as operator:
        await asyncio.to_thread(live.apply, older)

        async def created() -> bool:
            cr = await get(live, "obd", "orders") or {}
            invoices_worker = await get(live, "deployment", "orders-worker-invoices")
            job = await asyncio.to_thread(live.kubectl, "get", "jobs", "-o", "name")
            return bool(invoices_worker and job.strip() and not cr["metadata"].get("finalizers"))

        await eventually(created, within=120, interval=1)
        # A second dispatcher on the same Redis database: the operator reads whether the
        # owner of its shard key still exists (get), and reports the conflict.
        second = dispatcher("payments", queues=[emails], enqueuer={"replicas": 0})
        second["metadata"]["namespace"] = live.name
        await asyncio.to_thread(live.apply, second)

        async def conflict() -> bool:
            found = await asyncio.to_thread(live.condition, "payments", "Degraded")
            return found == ("True", "RedisConflict")

        await eventually(conflict, within=120, interval=1)
        # Someone loosens a budget by hand: the next pass applies it back.
        await asyncio.to_thread(
            live.kubectl, "patch", "pdb", "orders-worker-emails", "--type=merge",
            "-p", json.dumps({"spec": {"maxUnavailable": 3}}),
        )  # fmt: skip
        changed = {**emails, "handler": "app.tasks:send_v2"}
        shrunk = dispatcher("orders", queues=[changed], enqueuer={"replicas": 0})
        shrunk["metadata"]["namespace"] = live.name
        await asyncio.to_thread(live.apply, shrunk)

        async def pruned() -> bool:
            worker = await get(live, "deployment", "orders-worker-emails")
            gone = await get(live, "deployment", "orders-worker-invoices")
            budget = await get(live, "pdb", "orders-worker-emails") or {}
            return (
                gone is None
                and "--handler=app.tasks:send_v2" in json.dumps(worker)
                and budget.get("spec", {}).get("maxUnavailable") == 1
            )

        await eventually(pruned, within=120, interval=1)
        assert operator.client is not None
        used = {
            (resource, verb)
            for (resource, counted), count in operator.client.requests.items()
            # API discovery (GET /apis/GROUP/VERSION: whether the CRD is served, the liveness)
            # names no resource: every authenticated user may (system:discovery), no Role can.
            if count and "/" in resource
            # A server-side apply is a patch, and a create when the object is new (as here).
            for verb in (APPLY if counted == "apply" else (counted,))
        }
        refused = dict(operator.client.refused)
    assert refused == {}, "the Role lacks these"
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == ACCOUNT]
    # The client names the core group "": "/secrets" is the Role's ("", "secrets").
    assert used - granted(role) == set(), "used but not granted"
    assert granted(role) - used - KOPFS - ADMISSION == set(), "granted but never used"
