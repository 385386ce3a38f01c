"""The operator's readiness (``/readyz``) against the real API server, kopf running in-process.

Not ready while kopf's start-up activities run (a start-up handler of the test holds them),
nor is kopf's liveness endpoint up then; ready once they finished and the CRD is served; not
ready again once the operator stops. The operator is wired as ``dispatcher operator`` wires it:
``Operator.started`` is kopf's ready flag and ``Operator.ready`` the server's readiness.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf
import pytest
from prometheus_client import CollectorRegistry

from dispatcher.cli.operator import operator_settings
from dispatcher.controller.handlers import register, register_login
from dispatcher.controller.loops import Operator
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.demo.throwaway import free_port
from dispatcher.observability import ObservabilityServer
from tests.operator_kit import spawned_by_kopf
from tests.waiting import eventually
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

NS = "readiness"


async def status(url: str) -> int | None:
    """The HTTP status at ``url``, or None if nothing listens there."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status
    except aiohttp.ClientConnectionError:
        return None


async def test_readyz_is_ready_only_between_startup_and_stop(
    cluster: Cluster, crd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.run("kubectl", "create", "namespace", NS)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # kopf's kubeconfig login
    operator = Operator(OperatorConfig())
    registry = kopf.OperatorRegistry()
    register_login(registry)
    register(registry, operator)
    entered, hold = asyncio.Event(), asyncio.Event()

    @kopf.on.startup(registry=registry)
    async def slow_startup(**_: Any) -> None:
        entered.set()
        await hold.wait()

    server = ObservabilityServer(
        port=free_port(), host="127.0.0.1", ready=operator.ready, registry=CollectorRegistry()
    )
    ready_url = f"http://127.0.0.1:{server.port}/readyz"
    live_url = f"http://127.0.0.1:{free_port()}/healthz"
    await server.start()
    stop = asyncio.Event()
    before = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=operator_settings([NS], all_namespaces=False),
        standalone=True,
        namespaces=[NS],
        liveness_endpoint=live_url,
        stop_flag=stop,
        ready_flag=operator.started,
    )
    try:
        await asyncio.wait_for(entered.wait(), 30)
        assert await status(ready_url) == 503
        assert await status(live_url) is None  # kopf serves it only after start-up
        hold.set()

        async def ready() -> bool:
            return await status(ready_url) == 200

        await eventually(ready, within=30, what="/readyz ready")
        assert await status(live_url) == 200
    finally:
        hold.set()
        stop.set()
        ignored = before | {t for t in asyncio.all_tasks() if not spawned_by_kopf(t)}
        await asyncio.wait_for(kopf.run_tasks(tasks, ignored=ignored), 30)
    try:
        assert await status(ready_url) == 503
    finally:
        await server.stop()
        cluster.run("kubectl", "delete", "namespace", NS, "--wait=false")
