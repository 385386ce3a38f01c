"""The Secrets a dispatcher reads: a rotated one rolls the pods that read it (within
``secret_ttl``), and only those; each role reads its own Redis Secret; no URL is written
into a Deployment or an Event.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis

from dispatcher.stream.naming import SHARDS_KEY
from tests.e2e.live_dispatcher import condition, container, events, get, idle, until
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.suite_servers import postgres_admin_url

pytestmark = pytest.mark.timeout(600)


def template_annotations(deployment: dict[str, Any] | None) -> dict[str, str]:
    template = (deployment or {}).get("spec", {}).get("template", {})
    return dict(template.get("metadata", {}).get("annotations") or {})


async def test_rotating_a_referenced_secret_rolls_the_pods_that_use_it(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """Within ``secret_ttl`` (1 s here) of a rotation, the pods that read it roll, and only
    those; no URL is written into a Deployment."""
    live = live_namespace
    emails = {"name": "emails", "handler": "app.tasks:send"}
    names = ("orders-enqueuer", "orders-worker-emails")
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, idle(live, emails))
        await until(lambda: get(live, "deployment", names[1]))
        await until(lambda: get(live, "deployment", names[0]))
        before = {name: template_annotations(await get(live, "deployment", name)) for name in names}

        await asyncio.to_thread(
            live.secret, "pg", postgres_admin_url() + "?application_name=rotated"
        )

        async def enqueuer_rolled() -> bool:
            return template_annotations(await get(live, "deployment", names[0])) != before[names[0]]

        await until(enqueuer_rolled)
        assert template_annotations(await get(live, "deployment", names[1])) == before[names[1]]
        await asyncio.to_thread(live.secret, "rd", redis_url + "?health_check_interval=10")

        async def worker_rolled() -> bool:
            return template_annotations(await get(live, "deployment", names[1])) != before[names[1]]

        await until(worker_rolled)
        listed = await asyncio.to_thread(live.kubectl, "get", "deployments", "-o", "json")
        assert redis_url not in listed


async def test_each_role_uses_its_own_redis_secret(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """Only the operator's Secret holds a reachable URL: the shard key proves it was used."""
    live = live_namespace
    await asyncio.to_thread(
        live.secret, "rd-enqueuer", "redis://dispatcher-enqueuer:pw@redis:6379/0"
    )
    await asyncio.to_thread(live.secret, "rd-operator", redis_url)
    refs = {f"{role}SecretRef": {"name": f"rd-{role}", "key": "url"}
            for role in ("enqueuer", "worker", "operator")}  # fmt: skip
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, idle(live, redis=refs))

        async def missing() -> bool:
            found = await condition(live, "Degraded")
            return found.get("reason") == "SecretMissing" and "rd-worker" in found["message"]

        await until(missing)
        assert await get(live, "deployment", "orders-worker-emails") is None
        await asyncio.to_thread(
            live.secret, "rd-worker", "redis://dispatcher-worker:pw@redis:6379/0"
        )

        async def applied() -> bool:
            names = ("orders-enqueuer", "orders-worker-emails")
            return all([await get(live, "deployment", name) is not None for name in names])

        await until(applied)

    async def redis_ref(name: str) -> Any:
        env = container(await get(live, "deployment", name))["env"]
        return next(e["valueFrom"]["secretKeyRef"] for e in env if e["name"] == "REDIS_URL")

    assert await redis_ref("orders-enqueuer") == {"name": "rd-enqueuer", "key": "url"}
    assert await redis_ref("orders-worker-emails") == {"name": "rd-worker", "key": "url"}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.get(SHARDS_KEY) == "2"
    client.close()
    assert redis_url not in json.dumps(await events(live))
