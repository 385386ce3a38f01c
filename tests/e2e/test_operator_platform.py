"""The operator's platform duties against the real API server, kopf running in-process.

``running_live_operator`` runs kopf and the ``Operator`` as ``dispatcher operator`` does,
watching a namespace of the test's own (``live_namespace``). Here: liveness (``/healthz``, on
the one port with ``/readyz`` and ``/metrics``) answers 200 once the CRD is served, 503 when the
operator started before its CRD (and still 503 once the CRD comes: kopf, scanning off, watches
nothing until a restart), and the operator does
its Redis work (publish and lower the shard count, measure the backlog) as the
``dispatcher-operator`` ACL user of docs/security.md, with nothing denied."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
import redis as sync_redis
from redis.exceptions import NoPermissionError

from dispatcher.controller.probes import CrdProbe
from dispatcher.demo.throwaway import RedisProcess, free_port
from tests.fix_live_operator import CRD_NAME, LiveNamespace, running_live_operator, serve_crd
from tests.fix_redis import user_url
from tests.waiting import eventually
from tools.cluster import Cluster

ROLES = ("enqueuer", "worker", "operator")


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def test_one_port_serves_liveness_readiness_and_metrics(
    live_namespace: LiveNamespace,
) -> None:
    port = free_port()
    async with running_live_operator(live_namespace, port=port):
        base = f"http://127.0.0.1:{port}"
        assert await _get(f"{base}/healthz") == (200, "ok\n")

        async def ready() -> bool:  # the CRD is asked once kopf started
            return (await _get(f"{base}/readyz"))[0] == 200

        await eventually(ready, within=30, what="/readyz ready")
        status, metrics = await _get(f"{base}/metrics")
        assert status == 200
        assert "dispatcher_operator_reconciles_total" in metrics


async def test_liveness_fails_when_the_operator_started_before_its_crd(
    cluster: Cluster, live_namespace: LiveNamespace
) -> None:
    """The CRD is taken away as an uninstall does (``test_control_plane`` does it too; the
    ``crd`` fixture and ``live_namespace`` apply it again for later tests), the operator
    starts, then the CRD comes back."""
    cluster.run("kubectl", "delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s")
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}/healthz"
        async with running_live_operator(live_namespace, port=port, crd=CrdProbe(max_age=0)):
            assert await _get(url) == (503, "not ok\n")
            serve_crd(cluster)
            assert await _get(url) == (503, "not ok\n")
            assert (await _get(f"http://127.0.0.1:{port}/readyz"))[0] == 503
    finally:
        serve_crd(cluster)


async def test_operator_runs_as_the_documented_acl_user(
    live_namespace: LiveNamespace, acl_redis: tuple[RedisProcess, dict[str, str]]
) -> None:
    """One Redis Secret per role: the operator publishes and lowers the shard count and
    measures the backlog as ``dispatcher-operator``; the ACL log stays empty, and that user
    may not touch the streams, other keys or the server."""
    live = live_namespace
    server, passwords = acl_redis
    urls = {user: user_url(server.port, user, password) for user, password in passwords.items()}
    admin = sync_redis.Redis(port=server.port, decode_responses=True)
    for shard in range(4):
        admin.xgroup_create(f"workflow.tasks.emails.{shard}", "workers", id="0", mkstream=True)
    admin.xadd("workflow.tasks.emails.1", {"task_id": "t1"})
    for role in ROLES:
        live.secret(f"rd-{role}", urls[f"dispatcher-{role}"])
    cr = {
        "apiVersion": "dispatch.composer.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "acl"},
        "spec": {
            "shards": 4,
            "migrate": False,
            "postgres": {"secretRef": {"name": "pg", "key": "url"}},
            "redis": {f"{r}SecretRef": {"name": f"rd-{r}", "key": "url"} for r in ROLES},
            "queues": [{"name": "emails", "handler": "app.tasks:send"}],
        },
    }

    def status() -> dict[str, Any]:
        return dict((live.get("obd", "acl") or {}).get("status") or {})

    def measured() -> bool:
        rows = status().get("queues") or []
        return status().get("shards") == 4 and bool(rows) and rows[0].get("backlog") == 1

    async with running_live_operator(live):
        live.apply(cr)
        await eventually(measured, within=90, interval=0.5)
        admin.xdel(
            "workflow.tasks.emails.1", *[e[0] for e in admin.xrange("workflow.tasks.emails.1")]
        )
        patch = json.dumps({"spec": {"shards": 2}})  # the operator checks XLEN first
        live.kubectl("patch", "obd", "acl", "--type=merge", "-p", patch)
        await eventually(lambda: status().get("shards") == 2, within=90, interval=0.5)
    assert admin.get("composer:stream_shards") == "2"
    assert server.cli("ACL", "LOG") == "", "no command or key was denied"
    as_operator = sync_redis.Redis.from_url(urls["dispatcher-operator"], decode_responses=True)
    for command in (
        ("XADD", "workflow.tasks.emails.0", "*", "a", "b"),
        ("XREADGROUP", "GROUP", "workers", "x", "STREAMS", "workflow.tasks.emails.0", ">"),
        ("SET", "dispatcher:done:x", "1"),
        ("GET", "app:secret"),
        ("KEYS", "*"),
        ("FLUSHALL",),
    ):
        with pytest.raises(NoPermissionError):
            as_operator.execute_command(*command)
    as_operator.close()
    admin.close()
