"""The status fields ``kubectl get obd`` prints: every queue, ready pods, the backlog."""

from __future__ import annotations

import datetime
from typing import Any

from dispatcher.controller.conditions import OutboxDispatcherStatus
from dispatcher.controller.glance import at_a_glance, ready_of
from dispatcher.controller.report import Failure, Pass, status_after

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def deployment(replicas: int, ready: int | None) -> dict[str, Any]:
    status = {} if ready is None else {"readyReplicas": ready}
    return {"spec": {"replicas": replicas}, "status": status}


def test_every_queue_ready_pods_and_the_summed_backlog() -> None:
    glance = at_a_glance(
        queues=["alpha", "beta"],
        enqueuers=[deployment(2, 1)],
        workers=[deployment(3, 3), deployment(2, None)],
        enqueuer_replicas=2,
        rows=[{"name": "alpha", "backlog": 120, "pending": 4}, {"name": "beta", "backlog": 0}],
    )
    assert glance == {
        "queueNames": "alpha,beta",
        "workers": "3/5",
        "enqueuers": "1/2",
        "backlog": 120,
        "pending": 4,
    }


def test_an_enqueuer_not_created_yet_counts_as_wanted_and_unmeasured_queues_sum_nothing() -> None:
    assert ready_of([], wanted=2) == "0/2"
    assert ready_of([]) == "0/0"
    glance = at_a_glance(
        queues=["alpha"], enqueuers=[], workers=[], enqueuer_replicas=1,
        rows=[{"name": "alpha"}],  # Redis did not answer
    )  # fmt: skip
    assert glance == {"queueNames": "alpha", "workers": "0/0", "enqueuers": "0/1"}


def test_what_a_pass_could_not_tell_keeps_its_last_value() -> None:
    before = OutboxDispatcherStatus.model_validate(
        {"queueNames": "alpha", "workers": "1/1", "backlog": 7, "pending": 2}
    )
    unmeasured = Pass(
        problem=Failure("RedisUnavailable", "no answer"),
        glance={"queueNames": "alpha,beta", "workers": "1/2", "enqueuers": "1/1"},
    )
    after = status_after(before, unmeasured, now=NOW, generation=2)
    assert {k: after[k] for k in ("queueNames", "workers", "enqueuers", "backlog", "pending")} == {
        "queueNames": "alpha,beta",
        "workers": "1/2",
        "enqueuers": "1/1",
        "backlog": 7,
        "pending": 2,
    }
    # The written status reads back (an older operator ignores fields it does not know).
    assert OutboxDispatcherStatus.model_validate(after).backlog == 7
