"""The autoscaler: a backlog scales a queue's workers up at once and down after its
stabilization window, and a spec change never resets what it chose.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.

The autoscaler runs on an injected clock (``tests.operator_kit.FakeClock``); where a step must
see what one pass decides, the test runs that pass itself (``Operator.sync``). A worker
replica is a Pod the cluster runs (never available: what is checked is what the operator
writes).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.live_dispatcher import (
    EMAILS,
    NAME,
    WORKERS,
    body,
    burst,
    events,
    get,
    replicas,
    scaled,
    status_of,
    until,
)
from tests.fix_live_operator import LiveNamespace, running_live_operator
from tests.operator_kit import FakeClock

pytestmark = pytest.mark.timeout(600)


async def test_backlog_scales_up_at_once_and_down_after_stabilization(
    live_namespace: LiveNamespace, live_redis: Any
) -> None:
    live, clock = live_namespace, FakeClock()
    queue = {**EMAILS, "targetBacklogPerReplica": 100, "scaleDownStabilizationSeconds": 300}
    async with running_live_operator(live, clock=clock) as operator:
        await asyncio.to_thread(live.apply, body(live, queue))
        await until(lambda: scaled(live, 1))
        # From here on each step runs one pass itself (besides the operator's own loop): what
        # a pass decides depends on the injected clock and Redis only.
        key = (live.name, NAME)
        await burst(live_redis, 250)  # ceil(250 / 100) = 3 replicas
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.replicas, row.desired_replicas) == (250, 3, 3)
        assert row.last_scale_time == clock.now

        # A worker took 10 entries and has not acked them yet: pending, still in the backlog.
        await live_redis.xgroup_create("workflow.tasks.emails.0", "workers", id="0")
        await live_redis.xreadgroup("workers", "w1", {"workflow.tasks.emails.0": ">"}, count=10)
        await operator.sync(key)
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.pending, row.backlog) == (10, 250)

        await live_redis.delete("workflow.tasks.emails.0", "workflow.tasks.emails.1")  # drained
        await operator.sync(key)
        row = (await status_of(live)).queue("emails")
        assert row is not None
        assert (row.backlog, row.desired_replicas) == (0, 1)
        clock.advance(299)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3  # still inside the window

        clock.advance(1)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 1

        assert len(await events(live, "Scaled")) == 2  # one Event per change


async def test_a_spec_change_keeps_the_replicas_the_autoscaler_chose(
    live_namespace: LiveNamespace, live_redis: Any
) -> None:
    """Reconciling a changed spec re-renders the worker Deployment but never resets the
    replicas the backlog asked for: reconcile and autoscale are one decision."""
    live = live_namespace
    queue = {**EMAILS, "targetBacklogPerReplica": 100}
    async with running_live_operator(live, clock=FakeClock()) as operator:
        await asyncio.to_thread(live.apply, body(live, queue))
        await until(lambda: scaled(live, 1))
        await burst(live_redis, 250)  # ceil(250 / 100) = 3 replicas
        key = (live.name, NAME)
        await operator.sync(key)
        assert await replicas(live, WORKERS[0]) == 3

        changed = [{**queue, "handler": "app.tasks:send_v2"}]
        await asyncio.to_thread(live.apply, body(live, *changed))

        async def rolled() -> bool:
            await operator.sync(key)
            found = await get(live, "deployment", WORKERS[0]) or {"spec": {}}
            args = found["spec"].get("template", {}).get("spec", {}).get("containers", [{}])
            return "--handler=app.tasks:send_v2" in args[0].get("args", [])

        await until(rolled)
        await operator.sync(key)  # after any pass under way: a reset would be raised again
        assert await replicas(live, WORKERS[0]) == 3, "the spec change reset the scale"
        assert len(await events(live, "Scaled")) == 1, "the spec change reset the scale"
