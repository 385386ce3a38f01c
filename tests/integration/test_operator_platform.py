"""The operator's liveness probe when it started before its CRD was served: red, and it stays
red when the CRD comes (kopf, scanning off, watches nothing until a restart).

The last test on kmock (``tests.fix_kube``): on the real API server the CRD is cluster-wide
and every e2e test's dispatchers hang off it, so it cannot be taken away for one test. Green
when served, and the operator's other platform duties, run on the real API server:
``tests/e2e/test_operator_platform.py``, ``test_operator_migration.py``, ``_secrets``,
``_workloads``, ``_metrics``.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kmock
import pytest

from dispatcher.demo.throwaway import free_port
from tests.fix_kube import (
    CR_RESOURCE,
    FakeClock,
    KubeEmulator,
    _declare_resources,
    running_operator,
)


async def _healthz(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


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
