"""Pure parts of the operator's lifecycle: quantities, rollout reading, conditions."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

from dispatcher.controller.api_requests import contains
from dispatcher.controller.conditions import OutboxDispatcherStatus, Rollout, rollout
from dispatcher.controller.loops import WatchEvent
from dispatcher.controller.migration import MigrationState
from dispatcher.controller.quantity import parse_quantity, same_quantity
from dispatcher.controller.report import (
    CONSOLE_URL_ANNOTATION,
    Failure,
    Pass,
    conditions,
    console_url,
    status_after,
)

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def test_quantities_compare_as_numbers() -> None:
    assert same_quantity("1024Mi", "1Gi")
    assert same_quantity("1000m", 1)
    assert same_quantity("0.5", "500m")
    assert not same_quantity("1G", "1Gi")
    assert parse_quantity("1e3") == Decimal(1000)
    assert parse_quantity("lots") is None
    assert parse_quantity(True) is None


def test_contains_treats_quantities_semantically_only_under_resources() -> None:
    live = {"resources": {"limits": {"memory": "1Gi"}}, "name": "1"}
    assert contains(live, {"resources": {"limits": {"memory": "1024Mi"}}})
    assert not contains(live, {"name": "1000m"})  # not a quantity field: strings differ


def _deployment(name: str, *, generation: int, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation},
        "spec": {"replicas": 2},
        "status": status,
    }


def test_rollout_reads_generation_and_available_replicas() -> None:
    done = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    stale = {**done, "observedGeneration": 2}
    crashing = {**done, "availableReplicas": 1}
    found = rollout(
        [
            _deployment("a", generation=3, status=done),
            _deployment("b", generation=3, status=stale),
            _deployment("c", generation=3, status=crashing),
            _deployment("d", generation=1, status={}),
        ]
    )
    assert found == Rollout(unavailable=("b", "c", "d"), rolling=("b", "d"))


def _types(found: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in found}


def test_a_problem_makes_ready_false_and_degraded_true_with_the_generation() -> None:
    result = Pass(problem=Failure("RedisUnavailable", "cannot reach Redis at r:6379"))
    found = conditions(OutboxDispatcherStatus(), result, now=NOW, generation=4)
    assert _types(found)["Ready"] == ("False", "RedisUnavailable")
    assert _types(found)["Degraded"] == ("True", "RedisUnavailable")
    assert {c["observedGeneration"] for c in found} == {4}


def test_unavailable_deployments_make_ready_false_and_draining_is_reported() -> None:
    result = Pass(
        rollout=Rollout(unavailable=("x",), rolling=("x",)), draining={"q": "3 entries, 0 pending"}
    )
    found = _types(conditions(OutboxDispatcherStatus(), result, now=NOW, generation=1))
    assert found == {
        "Ready": ("False", "DeploymentsUnavailable"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
        "QueuesDraining": ("True", "Draining"),
    }


def test_a_running_migration_keeps_ready_false_until_the_enqueuer_may_start() -> None:
    running = MigrationState(phase="running", image="enq:2", job="orders-migrate-1")
    found = _types(
        conditions(OutboxDispatcherStatus(), Pass(migration=running), now=NOW, generation=1)
    )
    assert found["Ready"] == ("False", "Migrating")
    assert found["Migrated"] == ("False", "Running")
    assert found["Degraded"] == ("False", "AsExpected")
    done = MigrationState(phase="succeeded", image="enq:2")
    found = _types(
        conditions(OutboxDispatcherStatus(), Pass(migration=done), now=NOW, generation=1)
    )
    assert found["Ready"] == ("True", "Reconciled")
    assert found["Migrated"] == ("True", "Succeeded")


def test_a_watch_event_reads_kopfs_keyword_arguments() -> None:
    body = {"metadata": {"name": "orders", "namespace": "shop"}}
    listed = WatchEvent.from_kopf({"body": body, "type": None, "event": {}, "logger": None})
    assert (listed.deleted, listed.meta["name"]) == (False, "orders")  # the initial listing
    assert not WatchEvent.from_kopf({"body": body, "type": "MODIFIED"}).deleted
    assert WatchEvent.from_kopf({"body": body, "type": "DELETED"}).deleted


def test_the_status_names_the_console_the_annotation_names_and_nothing_else() -> None:
    url = "http://obd-console.ops.svc:80/"
    meta = {"annotations": {CONSOLE_URL_ANNOTATION: url}}
    after = status_after(
        OutboxDispatcherStatus(), Pass(), now=NOW, generation=3, console=console_url(meta)
    )
    assert after["consoleUrl"] == url
    assert OutboxDispatcherStatus.model_validate(after).console_url == url
    for odd in (
        {},
        {"annotations": None},
        {"annotations": {CONSOLE_URL_ANNOTATION: "javascript:x"}},
    ):
        assert console_url(odd) is None
    assert "consoleUrl" not in status_after(OutboxDispatcherStatus(), Pass(), now=NOW, generation=3)
