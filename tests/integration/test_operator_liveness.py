"""The operator's liveness against an API server that accepts and never answers: it answers
"live" within the kubelet's probe timeout (a restart would not bring the API server back),
instead of hanging on the client's retries (four tries of 60 s each)."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client import Configuration

from dispatcher.controller.api_connection import KubeClient
from dispatcher.controller.loops import Operator
from dispatcher.controller.operator_config import OperatorConfig

pytestmark = pytest.mark.timeout(60)  # a hang detector: the client alone would take minutes


async def test_an_api_server_that_never_answers_leaves_the_operator_live(
    caplog: pytest.LogCaptureFixture,
) -> None:
    held: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _r, writer: held.append(writer), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = KubeClient.at(Configuration(host=f"http://127.0.0.1:{port}"))
    operator = Operator(OperatorConfig(), client=client)
    operator.started.set()  # kopf's start-up finished
    try:
        assert await operator.live() is True
        assert "did not say whether the CRD is served: no answer within 3 s" in caplog.text
        assert operator.crd.served_at_start is None  # nothing was learnt: asked again later
    finally:
        await client.close()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
