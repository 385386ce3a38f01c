"""The operator's readiness (``/readyz``) against the real API server, kopf running in-process.

Not ready, nor live, while kopf's start-up activities run (a start-up handler of the test holds
them); ready and live once they finished and the CRD is served; nothing served once the operator
stopped. The operator is wired as ``dispatcher operator`` wires it: one port for ``/healthz``,
``/readyz`` and ``/metrics``, served from kopf's start-up to its cleanup, ``Operator.started``
kopf's ready flag, and kopf logged in with the operator's own credentials (the kubeconfig).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf
import pytest

from dispatcher.cli.operator import operator_settings
from dispatcher.controller.handlers import register
from dispatcher.controller.loops import Operator
from dispatcher.controller.operator_config import OperatorConfig
from dispatcher.demo.throwaway import free_port
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
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # the operator's one login
    operator = Operator(OperatorConfig())
    registry = kopf.OperatorRegistry()
    port = free_port()
    register(registry, operator, port=port, host="127.0.0.1")
    entered, hold = asyncio.Event(), asyncio.Event()

    @kopf.on.startup(registry=registry)
    async def slow_startup(**_: Any) -> None:
        entered.set()
        await hold.wait()

    ready_url = f"http://127.0.0.1:{port}/readyz"
    live_url = f"http://127.0.0.1:{port}/healthz"
    stop = asyncio.Event()
    before = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=operator_settings([NS], all_namespaces=False),
        standalone=True,
        namespaces=[NS],
        stop_flag=stop,
        ready_flag=operator.started,
    )
    try:
        await asyncio.wait_for(entered.wait(), 30)

        async def serving() -> bool:  # kopf's start-up handlers run at once: ours starts it
            return await status(ready_url) is not None

        await eventually(serving, within=30, what="the probes served during start-up")
        assert await status(ready_url) == 503
        assert await status(live_url) == 503
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
        assert await status(ready_url) is None  # kopf's cleanup stopped serving
    finally:
        cluster.run("kubectl", "delete", "namespace", NS, "--wait=false")
