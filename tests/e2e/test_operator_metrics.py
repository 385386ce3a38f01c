"""The operator's metrics follow its passes and the autoscaler: reconciles by outcome, their
duration, autoscaler ticks, and each queue's replicas and backlog.

Setting: the operator in the test's loop, ``orders`` as ``tests.e2e.live_dispatcher`` says.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.live_dispatcher import NAME, idle, until
from tests.fix_live_operator import LiveNamespace, running_live_operator

pytestmark = pytest.mark.timeout(600)


async def test_operator_metrics_follow_reconciles_and_the_autoscaler(
    live_namespace: LiveNamespace,
) -> None:
    live = live_namespace
    async with running_live_operator(live) as operator:
        queue = {"name": "emails", "handler": "app.tasks:send", "minReplicas": 1}
        await asyncio.to_thread(live.apply, idle(live, queue))
        registry = operator.metrics.registry
        labels = {"namespace": live.name, "dispatcher": NAME, "queue": "emails"}

        async def measured() -> bool:
            applied = registry.get_sample_value(
                "dispatcher_operator_reconciles_total", {"outcome": "applied"}
            )
            replicas = registry.get_sample_value("dispatcher_operator_queue_replicas", labels)
            backlog = registry.get_sample_value("dispatcher_operator_queue_backlog", labels)
            return bool(applied) and replicas == 1 and backlog == 0

        await until(measured)
        assert registry.get_sample_value("dispatcher_operator_reconcile_seconds_count")
        ticks = {"outcome": "ok"}
        assert registry.get_sample_value("dispatcher_operator_autoscale_ticks_total", ticks)
