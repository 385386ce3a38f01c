"""The real operator, in this test's event loop, against the local cluster's API server.

``live_namespace`` is a namespace of its own per test (with the CRD applied and the
``pg``/``rd`` Secrets of ``tests.operator_kit.dispatcher()`` pointing at the suite's
PostgreSQL and a Redis of the test), deleted afterwards. ``running_live_operator`` runs
kopf and ``dispatcher.controller.loops.Operator`` as ``dispatcher operator`` does, watching that
namespace only; its ``KubeClient`` may go through another server address (a
``tests.fix_proxy.TcpProxy`` in front of the API server, to cut its watches).
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
import redis.asyncio as aioredis

from dispatcher.controller.api_connection import KubeClient
from dispatcher.controller.handlers import register
from dispatcher.controller.loops import Operator
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.controller.probes import CrdProbe
from tests.operator_kit import kopf_running
from tests.suite_servers import postgres_admin_url
from tests.waiting import eventually_sync
from tools.cluster import Cluster
from tools.cluster.binaries import ROOT

CRD = ROOT / "crds" / "outboxdispatchers.yaml"
CRD_NAME = "outboxdispatchers.dispatch.composer.dev"


@dataclass(frozen=True)
class LiveNamespace:
    """A namespace of the local cluster, and kubectl in it."""

    cluster: Cluster
    name: str

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.cluster.run("kubectl", "-n", self.name, *args, stdin=stdin)

    def apply(self, *objects: dict[str, Any], server_side: bool = False) -> None:
        flags = ["--server-side"] if server_side else []
        for obj in objects:
            self.kubectl("apply", *flags, "-f", "-", stdin=json.dumps(obj))

    def secret(self, name: str, url: str) -> None:
        """A Secret ``name`` whose ``url`` key holds ``url``."""
        data = {"url": base64.b64encode(url.encode()).decode()}
        self.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                    "data": data})  # fmt: skip

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None if there is none."""
        found = self.kubectl(
            "get", kind, name, "-o", "json", "--ignore-not-found", "--show-managed-fields"
        )
        return json.loads(found) if found.strip() else None

    def condition(self, name: str, type_: str) -> tuple[str, str] | None:
        """``(status, reason)`` of a condition of the dispatcher, None while absent."""
        for found in ((self.get("obd", name) or {}).get("status") or {}).get("conditions") or []:
            if found["type"] == type_:
                return str(found["status"]), str(found["reason"])
        return None


def serve_crd(cluster: Cluster) -> None:
    """Apply this tree's CRD and wait until the API server serves it."""
    cluster.run("kubectl", "apply", "--server-side", "-f", str(CRD))
    # kubectl wait fails on a CRD the API server has not given a status yet.
    eventually_sync(
        lambda: cluster.run("kubectl", "wait", "--for=condition=Established", f"crd/{CRD_NAME}"),
        within=60,
        interval=0.5,
        ignoring=(RuntimeError,),
    )


@pytest.fixture
def live_namespace(cluster: Cluster, redis_url: str) -> Iterator[LiveNamespace]:
    serve_crd(cluster)
    name = f"op-{uuid.uuid4().hex[:8]}"
    cluster.run("kubectl", "create", "namespace", name)
    live = LiveNamespace(cluster, name)
    for secret, url in (("pg", postgres_admin_url()), ("rd", redis_url)):
        live.secret(secret, url)
    try:
        yield live
    finally:
        cluster.run("kubectl", "delete", "namespace", name, "--wait=false")


@pytest.fixture
async def live_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The test's Redis (the one the namespace's ``rd`` Secret names), as a plain redis-py
    client that decodes what it reads: what a test reads and writes beside the operator."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def kubeconfig_via(
    cluster: Cluster, path: Path, *, server: str | None = None, token: str | None = None
) -> Path:
    """A copy of the cluster's admin kubeconfig that reaches the API server at ``server``,
    or (with ``token``) authenticates with that bearer token instead of the admin's
    certificate."""
    config = json.loads(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = server or cluster.server
    if token is not None:
        config["users"][0]["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return path


@contextlib.asynccontextmanager
async def running_live_operator(
    live: LiveNamespace,
    *,
    kubeconfig: Path | None = None,
    port: int = 0,
    crd: CrdProbe | None = None,
    **config_: Any,
) -> AsyncIterator[Operator]:
    """kopf and the operator, until the block ends; all their requests go to the API server
    that ``kubeconfig`` names (the cluster's own by default): the operator's client logs in
    with it and kopf is handed the same credentials, as in ``dispatcher operator``. ``port``:
    serve ``/healthz``, ``/readyz`` and ``/metrics`` there, on 127.0.0.1; ``crd``: the
    liveness probe (one that remembers nothing, to see a change at once)."""
    config = OperatorConfig(
        **{"autoscale_interval": 1.0, "retry_base": 0.2, "retry_cap": 2.0, **config_}
    )
    client = await KubeClient.connect(str(kubeconfig or live.cluster.kubeconfig))
    registry = kopf.OperatorRegistry()
    operator = Operator(config, client=client, crd=crd or CrdProbe())
    running = register(registry, operator, port=port, host="127.0.0.1")
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.watching.reconnect_backoff = 0.2
    async with kopf_running(
        registry, settings, namespace=live.name, ready=running.started, seconds=60
    ):
        yield running
