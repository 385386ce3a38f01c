"""The dispatcher's conditions say what is wrong: ``Ready`` follows the Deployments,
``Progressing`` their rollouts, ``Degraded`` a missing Secret or an unreachable Redis or
PostgreSQL (without a password in any message or Event); an invalid spec is refused.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.

The cluster does it all: the Deployment controller rolls out (a worker whose
pods never get ready stays unavailable). With Redis unreachable the autoscaler holds the
replicas it has (no backlog known is no reason to scale down).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.e2e.live_dispatcher import (
    EMAILS,
    NAME,
    WORKERS,
    body,
    burst,
    condition,
    condition_of,
    events,
    get,
    idle,
    replicas,
    scaled,
    settled,
    shows,
    status_of,
    until,
)
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.operator_kit import FakeClock, secret
from tests.suite_servers import postgres_admin_url

pytestmark = pytest.mark.timeout(600)


async def test_ready_follows_the_deployments_and_progressing_their_rollouts(
    live_namespace: LiveNamespace,
) -> None:
    """A worker whose pods never get ready (its handler does not import) keeps the dispatcher
    not ``Ready``; a spec change then rolls out and never finishes (the old pod stays until a
    new one is available): ``Progressing``. Scaled to zero, both turn."""
    live = live_namespace
    stuck = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1, "maxReplicas": 1}
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live, stuck))

        async def unavailable() -> bool:
            return await shows(live, "Ready", "False", "DeploymentsUnavailable")

        await until(unavailable)
        await asyncio.to_thread(live.apply, idle(live, {**stuck, "handler": "app.tasks:v2"}))

        async def rolling() -> bool:
            cr = await get(live, "obd", NAME) or {}
            return (
                (cr.get("status") or {}).get("observedGeneration") == 2
                and await unavailable()
                and await shows(live, "Progressing", "True", "RollingOut")
                and await shows(live, "Degraded", "False", "AsExpected")
            )

        await until(rolling)
        assert "orders-worker-emails" in (await condition(live, "Progressing"))["message"]
        message = (await condition(live, "Ready"))["message"]
        assert "orders-worker-emails" in message
        assert "orders-enqueuer" not in message
        # Scaled to zero (at once), the Deployment controller completes the rollout.
        scaled = {**stuck, "minReplicas": 0, "scaleDownStabilizationSeconds": 0}
        await asyncio.to_thread(live.apply, idle(live, scaled))

        async def available() -> bool:
            return await shows(live, "Ready", "True", "Reconciled") and await shows(
                live, "Progressing", "False", "RolloutComplete"
            )

        await until(available)


async def test_unreachable_redis_or_postgres_is_degraded_and_not_ready(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    live = live_namespace
    async with running_live_operator(live, secret_ttl=1.0):
        await asyncio.to_thread(live.apply, idle(live))

        async def ready() -> bool:
            return await shows(live, "Ready", "True", "Reconciled")

        await until(ready)
        await asyncio.to_thread(live.secret, "rd", "redis://:hunter2@127.0.0.1:1/0")

        async def down(reason: str) -> bool:
            return await shows(live, "Degraded", "True", reason) and await shows(
                live, "Ready", "False", reason
            )

        await until(lambda: down("RedisUnavailable"))
        await asyncio.to_thread(live.secret, "rd", redis_url)
        await until(ready)
        await asyncio.to_thread(live.secret, "pg", "postgresql://app:hunter2@127.0.0.1:1/app")
        await until(lambda: down("PostgresUnavailable"))
        degraded = await condition(live, "Degraded")
        assert "127.0.0.1:1" in degraded["message"]
        cr = await get(live, "obd", NAME) or {}
        assert "hunter2" not in json.dumps(cr["status"]) + json.dumps(await events(live))
        assert degraded["observedGeneration"] == cr["status"]["observedGeneration"] == 1


async def test_missing_secret_and_an_invalid_spec_degrade_or_are_refused(
    live_namespace: LiveNamespace, redis_url: str
) -> None:
    """An invalid spec (``minReplicas`` above ``maxReplicas``) never
    reaches a real API server's store: the CRD's rule refuses it with the model's message,
    and the running dispatcher is left as it was."""
    live = live_namespace
    await asyncio.to_thread(live.kubectl, "delete", "secret", "pg", "rd")
    async with running_live_operator(live):
        await asyncio.to_thread(live.apply, idle(live))

        await until(lambda: shows(live, "Degraded", "True", "SecretMissing"))
        assert await condition_of(live, "Ready") == ("False", "SecretMissing")
        await until(lambda: events(live, "SecretMissing"))
        assert await get(live, "deployment", "orders-enqueuer") is None

        pg, rd = secret("pg", url=postgres_admin_url()), secret("rd", url=redis_url)
        await asyncio.to_thread(live.apply, pg, rd)  # retried with backoff: recovers on its own
        await settled(live, ready=True)

        bad = idle(live)
        bad["spec"]["queues"] = [
            {"name": "emails", "handler": "m:f", "minReplicas": 4, "maxReplicas": 2}
        ]
        with pytest.raises(RuntimeError, match="minReplicas must be <= maxReplicas"):
            await asyncio.to_thread(live.apply, bad)
        assert (await status_of(live)).observed_generation == 1
        assert await condition_of(live, "Degraded") == ("False", "AsExpected")


async def test_unreachable_redis_degrades_and_holds_replicas(
    live_namespace: LiveNamespace, redis_url: str, live_redis: Any
) -> None:
    live, clock = live_namespace, FakeClock()
    async with running_live_operator(live, clock=clock, secret_ttl=0.5) as operator:
        await asyncio.to_thread(live.apply, body(live, EMAILS))
        await burst(live_redis, 300)

        await until(lambda: scaled(live, 3))

        # The Secret now points at a port nobody listens on: Redis is unreachable.
        await asyncio.to_thread(live.secret, "rd", "redis://:hunter2@127.0.0.1:1/0")

        await until(lambda: shows(live, "Degraded", "True", "RedisUnavailable"))
        found = (await status_of(live)).condition("Degraded")
        assert found is not None
        assert "127.0.0.1:1" in found.message
        await until(lambda: events(live, "RedisUnavailable"))
        assert "hunter2" not in json.dumps(await events(live)) + found.message

        await live_redis.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")
        clock.advance(3600)  # far past the window: with no backlog known, hold anyway
        assert not await operator.sync((live.name, NAME))  # a pass on the advanced clock
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.replicas) == (None, 3)
        assert await replicas(live, WORKERS[0]) == 3

        await asyncio.to_thread(live.secret, "rd", redis_url)

        await until(lambda: shows(live, "Degraded", "False", "AsExpected"))
