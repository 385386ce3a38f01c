"""The operator's writes and caches on the real API server (#32): server-side apply, relists.

The operator runs in the test's event loop (``tests.fix_live_operator``) against the local
cluster, in a namespace of each test's own. Workloads are scaled to zero (no Pod needs to
run): what is checked is what the API server stores.

- A pod setting removed from the spec is removed from the Deployment (server-side apply
  under one field manager removes what the render leaves out), while what another manager
  wrote (a user's annotation) stays.
- A deleted Deployment comes back, and a field another manager took is taken back.
- Under ``autoscaling: external`` the replica count another manager set survives a backlog
  and an apply.
- An unchanged dispatcher (a spec change that renders the same objects, then more passes)
  leaves every owned object's ``resourceVersion`` as it was.
- A Deployment deleted while the operator's watches are cut (the TCP proxy in front of the
  API server holds, then drops, the DELETED event, and the version the watches had seen
  expires meanwhile, so none can resume and replay it) is re-created, and the dispatcher
  is not ``Degraded``: the relist after the cut replaces the cache.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from tests.e2e.live_dispatcher import NAME, condition_of, get, idle
from tests.fix_live_operator import LiveNamespace, kubeconfig_via, running_live_operator
from tests.fix_proxy import TcpProxy
from tests.waiting import eventually
from tools.cluster import HOST_IP

pytestmark = pytest.mark.timeout(600)

WORKER = f"{NAME}-worker-emails"
POD_SETTINGS = {
    "nodeSelector": {"disktype": "ssd"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "queues",
                     "effect": "NoSchedule"}],
    "priorityClassName": "od-e2e-missing",
    "podAnnotations": {"team.example/owner": "billing"},
}  # fmt: skip


def idle_dispatcher(live: LiveNamespace, **queue: Any) -> dict[str, Any]:
    """``idle()`` with its one queue ``emails``: no enqueuer, no worker, no Job."""
    return idle(live, {"name": "emails", "handler": "app.tasks:send", "minReplicas": 0,
                       "maxReplicas": 3, **queue})  # fmt: skip


async def deployment(live: LiveNamespace, name: str = WORKER) -> dict[str, Any] | None:
    return await get(live, "deployment", name)


async def pod_spec(live: LiveNamespace) -> dict[str, Any]:
    found = await eventually(lambda: deployment(live), within=60, what=f"Deployment {WORKER}")
    spec: dict[str, Any] = found["spec"]["template"]["spec"]
    return spec


def expired(live: LiveNamespace, version: str, *, since: float) -> bool:
    """Whether a watch of Deployments from ``version`` is refused as too old; if not, and
    the events after it are older than the 75 seconds the API server's watch cache keeps in
    any case, a hundred more Deployment events push them out of it (churned any sooner, the
    cache would grow instead)."""
    answer = live.cluster.run(
        "kubectl", "get", "--raw",
        f"/apis/apps/v1/deployments?watch=true&resourceVersion={version}&timeoutSeconds=1",
    )  # fmt: skip
    if "too old resource version" in answer:
        return True
    if time.monotonic() - since < 80:
        return False
    churn = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": f"churn-{i}", "labels": {"e2e": "churn"}},
         "spec": {"replicas": 0, "selector": {"matchLabels": {"e2e": "churn"}},
                  "template": {"metadata": {"labels": {"e2e": "churn"}},
                               "spec": {"containers": [{"name": "c", "image": "none"}]}}}}
        for i in range(50)
    ]}  # fmt: skip
    live.kubectl("apply", "-f", "-", stdin=json.dumps(churn))
    live.kubectl("delete", "deployments", "-l", "e2e=churn", "--wait=false")
    return False


async def test_removed_pod_settings_leave_the_deployment_and_others_fields_stay(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle_dispatcher(live, **POD_SETTINGS))

        async def has_settings() -> bool:
            spec = await pod_spec(live)
            return spec.get("nodeSelector") == POD_SETTINGS["nodeSelector"]

        await eventually(has_settings, within=60, interval=0.5)
        found = await deployment(live)
        assert found is not None
        template = found["spec"]["template"]
        assert template["spec"]["tolerations"] == POD_SETTINGS["tolerations"]
        assert template["spec"]["priorityClassName"] == "od-e2e-missing"
        assert template["metadata"]["annotations"]["team.example/owner"] == "billing"
        # Another manager's fields: a user's annotation on the Deployment and its template.
        await asyncio.to_thread(
            live.kubectl, "annotate", "deployment", WORKER, "example.com/ticket=OPS-1"
        )
        await asyncio.to_thread(
            live.kubectl, "patch", "deployment", WORKER, "--type=merge", "-p",
            '{"spec":{"template":{"metadata":{"labels":{"example.com/cost":"q"}}}}}',
        )  # fmt: skip

        await asyncio.to_thread(live.apply, idle_dispatcher(live))

        async def settings_gone() -> bool:
            spec = await pod_spec(live)
            return "nodeSelector" not in spec

        await eventually(settings_gone, within=60, interval=0.5)
        found = await deployment(live)
        assert found is not None
        template = found["spec"]["template"]
        assert "tolerations" not in template["spec"]
        assert "priorityClassName" not in template["spec"]
        assert "team.example/owner" not in template["metadata"]["annotations"]
        assert found["metadata"]["annotations"]["example.com/ticket"] == "OPS-1"
        assert template["metadata"]["labels"]["example.com/cost"] == "q"
        managers = {m["manager"] for m in found["metadata"]["managedFields"]}
        assert "outbox-dispatcher-operator" in managers
        assert await condition_of(live, "Degraded") == (
            "False",
            "AsExpected",
        )


async def test_a_deployment_deleted_while_the_watch_is_cut_is_created_again(
    live_namespace: LiveNamespace, tmp_path: Path
) -> None:
    live = live_namespace
    api = urlsplit(live.cluster.server)
    proxy = TcpProxy(int(api.port or 443), target_host=api.hostname or HOST_IP).start()
    try:
        server = f"https://127.0.0.1:{proxy.port}"
        kubeconfig = kubeconfig_via(live.cluster, tmp_path / "kubeconfig", server=server)
        async with running_live_operator(live, kubeconfig=kubeconfig) as operator:
            await asyncio.to_thread(live.apply, idle_dispatcher(live))
            first = await eventually(lambda: deployment(live), within=60, what=WORKER)
            await eventually(lambda: (live.name, WORKER) in operator.cache.deployments)

            proxy.blackhole()  # the watches hear nothing from here on
            listing = f"/apis/apps/v1/namespaces/{live.name}/deployments"
            listed = await asyncio.to_thread(live.cluster.run, "kubectl", "get", "--raw", listing)
            seen = json.loads(listed)["metadata"]["resourceVersion"]
            await asyncio.to_thread(live.kubectl, "delete", "deployment", WORKER)
            # Resuming a watch from where it was cut would replay the DELETED event; once the
            # API server no longer has that version (410 Gone), a watcher must list again.
            deleted = time.monotonic()
            await eventually(
                lambda: asyncio.to_thread(expired, live, seen, since=deleted),
                within=400,
                interval=2,
                what="watches from before the cut expire",
            )
            proxy.reset()  # the held events are lost with the connections
            proxy.heal()

            async def created_again() -> bool:
                found = await deployment(live)
                return found is not None and found["metadata"]["uid"] != first["metadata"]["uid"]

            await eventually(created_again, within=120, interval=0.5)
            # A spec change writes to it: the Deployment the operator holds is the new one.
            changed = {"podAnnotations": {"team.example/owner": "billing"}}
            await asyncio.to_thread(live.apply, idle_dispatcher(live, **changed))

            async def applied() -> bool:
                found = await deployment(live) or {}
                template = found.get("spec", {}).get("template", {})
                annotations = template.get("metadata", {}).get("annotations") or {}
                return annotations.get("team.example/owner") == "billing"

            await eventually(applied, within=60, interval=0.5)

            async def settled() -> bool:
                return await condition_of(live, "Degraded") == (
                    "False",
                    "AsExpected",
                )

            await eventually(settled, within=60, interval=0.5)
    finally:
        proxy.stop()


async def test_an_unchanged_dispatcher_is_never_written(live_namespace: LiveNamespace) -> None:
    """A spec change that renders the same objects (the API server stores
    ``1Gi`` for ``1024Mi``) and later passes leave every owned object's version as it was."""
    live = live_namespace
    resources = {"requests": {"memory": "1024Mi"}, "limits": {"memory": "2048Mi"}}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle_dispatcher(live, resources=resources))

        async def versions() -> dict[str, str]:
            found = {}
            for kind in ("deployments", "pdb"):
                listed = await asyncio.to_thread(live.kubectl, "get", kind, "-o", "json")
                for item in json.loads(listed)["items"]:
                    found[f"{kind}/{item['metadata']['name']}"] = item["metadata"][
                        "resourceVersion"
                    ]
            return found

        async def settled() -> bool:
            return (
                await condition_of(live, "Degraded")
                == (
                    "False",
                    "AsExpected",
                )
                and len(await versions()) == 4
            )

        await eventually(settled, within=60, interval=0.5)
        # The Deployment controller writes the new Deployments' status once: let it.
        await asyncio.sleep(3)
        before = await versions()
        same = idle_dispatcher(live, resources=resources, scaleDownStabilizationSeconds=600)
        await asyncio.to_thread(live.apply, same)

        async def observed() -> bool:
            cr = await get(live, "obd", NAME) or {}
            return (cr.get("status") or {}).get("observedGeneration") == 2

        await eventually(observed, within=60, interval=0.5)
        await asyncio.sleep(3)  # a few more passes (one a second)
        assert await versions() == before


async def test_external_autoscaling_leaves_replicas_to_the_users_scaler(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """Under ``autoscaling: external`` the replica count another manager
    sets (``kubectl scale`` here, an HPA in a cluster) survives a backlog the builtin
    autoscaler would act on, and an apply of a spec change."""
    live = live_namespace
    external = {"autoscaling": "external", "minReplicas": 1}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle_dispatcher(live, **external))
        await eventually(lambda: deployment(live), within=60, what=WORKER)
        await asyncio.to_thread(live.kubectl, "scale", "deployment", WORKER, "--replicas=0")
        client = redis.Redis.from_url(redis_url)
        for i in range(900):  # the builtin autoscaler would want ceil(900/100) = 9
            client.xadd(f"workflow.tasks.emails.{i % 2}", {"task_id": f"t{i}"})
        client.close()
        annotated = {**external, "podAnnotations": {"team.example/owner": "billing"}}
        await asyncio.to_thread(live.apply, idle_dispatcher(live, **annotated))

        async def measured_and_applied() -> bool:
            cr = await get(live, "obd", NAME) or {}
            rows = (cr.get("status") or {}).get("queues") or []
            found = await deployment(live) or {}
            template = found.get("spec", {}).get("template", {}).get("metadata", {})
            return any(r["name"] == "emails" and r.get("backlog") == 900 for r in rows) and (
                (template.get("annotations") or {}).get("team.example/owner") == "billing"
            )

        await eventually(measured_and_applied, within=60, interval=0.5)
        found = await deployment(live)
        assert found is not None
        assert found["spec"]["replicas"] == 0


async def test_a_deleted_or_edited_deployment_is_restored(live_namespace: LiveNamespace) -> None:
    """A deleted Deployment comes back (the watch reports it gone), and a
    field another manager changed (``kubectl edit``-style, so that manager now owns it) is
    taken back: the unforced apply conflicts, the forced one wins."""
    live = live_namespace
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle_dispatcher(live))
        first = await eventually(lambda: deployment(live), within=60, what=WORKER)
        enqueuer = f"{NAME}-enqueuer"
        found = await eventually(lambda: deployment(live, enqueuer), within=60, what=enqueuer)
        wanted = found["spec"]["template"]["spec"]["containers"][0]["args"]
        edited = {"spec": {"template": {"spec": {"containers": [
            {"name": "enqueuer", "args": ["enqueuer", "--edited"]}]}}}}  # fmt: skip
        await asyncio.to_thread(
            live.kubectl, "patch", "deployment", enqueuer, "--type=strategic",
            "-p", json.dumps(edited),
        )  # fmt: skip
        await asyncio.to_thread(live.kubectl, "delete", "deployment", WORKER)

        async def restored() -> bool:
            worker = await deployment(live)
            found = await deployment(live, enqueuer) or {}
            args = found.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
            return (
                worker is not None
                and worker["metadata"]["uid"] != first["metadata"]["uid"]
                and bool(args)
                and args[0].get("args") == wanted
            )

        await eventually(restored, within=60, interval=0.5)


async def test_two_dispatchers_never_share_a_deployment(
    live_namespace: LiveNamespace, another_redis_url: str
) -> None:
    """A dispatcher whose render names another's Deployment is
    ``Degraded=NameConflict`` and leaves that Deployment (owner, arguments) as it was.
    Each has a Redis database of its own (on one, the second is ``RedisConflict``)."""
    live = live_namespace
    await asyncio.to_thread(live.secret, "rd2", another_redis_url)

    def named(name: str, queue: str, redis: str = "rd") -> dict[str, Any]:
        body = idle_dispatcher(live)
        body["metadata"]["name"] = name
        body["spec"]["queues"][0]["name"] = queue
        body["spec"]["redis"] = {"secretRef": {"name": redis, "key": "url"}}
        return body

    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, named("a", "worker-b"))
        taken = "a-worker-worker-b"
        found = await eventually(lambda: deployment(live, taken), within=60, what=taken)
        owner = found["metadata"]["ownerReferences"]
        # Its render names the same Deployment.
        await asyncio.to_thread(live.apply, named("a-worker", "b", redis="rd2"))

        async def refused() -> bool:
            found = await asyncio.to_thread(live.condition, "a-worker", "Degraded")
            return found == ("True", "NameConflict")

        await eventually(refused, within=60, interval=0.5)
        found = await deployment(live, taken)
        assert found is not None
        assert found["metadata"]["ownerReferences"] == owner
        assert "--queue=worker-b" in json.dumps(found["spec"]["template"]["spec"])
