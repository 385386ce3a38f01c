"""The operator's watch stream read through the official client, fed what an API server
(or anything between) may send: a huge object, an ERROR event, garbage, a refusal.

A local HTTP server speaks the watch protocol (JSON lines on a chunked response) and sends
each case as it is written here; the client is the operator's ``KubeClient``. Every bad
line ends the watch with an ``APIError`` the informer handles by listing again; nothing is
yielded that is not an event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from dispatcher.controller.api_connection import APIError, APIGoneError, KubeClient

PATH = "/apis/apps/v1/namespaces/ns/deployments"


def _event(kind: str, name: str, **extra: Any) -> bytes:
    obj = {"kind": "Deployment", "metadata": {"name": name, "resourceVersion": "7"}, **extra}
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@pytest.fixture
async def serving(unused_tcp_port: int) -> AsyncIterator[tuple[KubeClient, list[bytes | int]]]:
    """The client, and what the next watch request gets: lines, or an HTTP status."""
    script: list[bytes | int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.query["watch"] == "true"
        if script and isinstance(script[0], int):
            status = script[0]
            body = {"kind": "Status", "code": status, "message": "deployments is forbidden"}
            return web.json_response(body, status=status)
        response = web.StreamResponse()
        await response.prepare(request)
        for line in script:
            assert isinstance(line, bytes)
            await response.write(line)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get(PATH, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{unused_tcp_port}")
    kube = KubeClient.at(configuration)
    try:
        yield kube, script
    finally:
        await kube.close()
        await runner.cleanup()


async def _read(kube: KubeClient) -> list[dict[str, Any]]:
    return [e async for e in kube.watch(PATH, query={"labelSelector": "a=b"}, seconds=5)]


async def test_events_of_any_size_arrive_whole_and_the_watch_ends_with_the_stream(
    serving: tuple[KubeClient, list[bytes | int]],
) -> None:
    kube, script = serving
    big = "x" * 1_200_000  # above aiohttp's default 128 KiB line limit, under etcd's 1.5 MiB
    script += [_event("ADDED", "a"), _event("MODIFIED", "b", big=big), _event("DELETED", "a")]
    events = await _read(kube)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "a"),
    ]
    assert events[1]["object"]["big"] == big
    assert kube.calls["watch"] == 1


@pytest.mark.parametrize(
    "bad",
    [b"garbage\n", b'{"no": "type"}\n', b'"a string"\n', b'{"type": "ADDED", "object": 3}\n'],
)
async def test_a_line_that_is_not_an_event_ends_the_watch_as_cut(
    serving: tuple[KubeClient, list[bytes | int]], bad: bytes
) -> None:
    kube, script = serving
    script += [_event("ADDED", "a"), bad, _event("ADDED", "never")]
    seen: list[str] = []

    async def read() -> None:
        async for event in kube.watch(PATH, query={}, seconds=5):
            seen.append(event["object"]["metadata"]["name"])

    with pytest.raises(APIError) as raised:
        await read()
    assert seen == ["a"]
    assert raised.value.status == 0


async def test_an_error_event_410_is_gone(serving: tuple[KubeClient, list[bytes | int]]) -> None:
    kube, script = serving
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    script += [json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"]
    with pytest.raises(APIGoneError):
        await _read(kube)


async def test_a_refused_watch_says_its_status_and_is_counted(
    serving: tuple[KubeClient, list[bytes | int]],
) -> None:
    kube, script = serving
    script.append(403)
    with pytest.raises(APIError) as raised:
        await _read(kube)
    assert raised.value.status == 403
    assert "forbidden" in str(raised.value)
    assert kube.refused[("apps/deployments", "watch")] == 1
