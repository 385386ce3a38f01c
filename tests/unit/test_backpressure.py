"""Backpressure decisions: the memory ratio Redis uses for OOM, the hysteresis, OOM outcomes."""

from __future__ import annotations

import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from dispatcher.outbox.backpressure import MemoryMarks, memory_ratio, paused_next
from dispatcher.outbox.outcomes import ClaimedRow, plan_outcomes
from dispatcher.stream.entries import PublishResult

MARKS = MemoryMarks(high=0.85, low=0.75)


def test_the_ratio_is_what_redis_counts_against_maxmemory() -> None:
    info = {"used_memory": 900, "mem_not_counted_for_evict": 100, "maxmemory": 1000}
    assert memory_ratio(info) == pytest.approx(0.8)
    assert memory_ratio({"used_memory": 900, "maxmemory": 0}) == 0.0, "no maxmemory: no limit"


@pytest.mark.parametrize(
    ("paused", "ratio", "expected"),
    [
        (False, 0.80, False),  # below high: keep claiming
        (False, 0.85, True),  # at high: pause
        (True, 0.80, True),  # between the marks: stay paused
        (True, 0.749, False),  # below low: resume
    ],
)
def test_pause_at_the_high_mark_resume_below_the_low_one(
    paused: bool, ratio: float, expected: bool
) -> None:
    assert paused_next(paused, ratio, MARKS) is expected


def test_a_high_mark_of_zero_never_pauses() -> None:
    assert paused_next(False, 1.0, MemoryMarks(high=0)) is False


@pytest.mark.parametrize(("high", "low"), [(0.8, 0.9), (1.2, 0.5), (0.8, 0)])
def test_marks_out_of_order_are_refused(high: float, low: float) -> None:
    with pytest.raises(ValueError, match="Redis memory marks"):
        MemoryMarks(high=high, low=low)


def test_an_oom_reply_holds_the_row_back_without_an_attempt() -> None:
    rows = [
        ClaimedRow(
            id=i,
            stream="workflow.tasks.q.0",
            payload="{}",
            attempt_count=4,
            max_retries=5,
            backoff_seconds=1,
            age_seconds=0.0,
        )
        for i in ("oom", "oom-plain", "other", "ok")
    ]
    oom = "OOM command not allowed when used memory > 'maxmemory'."
    results = [
        PublishResult(stream="s", error=OutOfMemoryError(oom)),
        PublishResult(stream="s", error=ResponseError(oom)),
        PublishResult(stream="s", error=ResponseError("WRONGTYPE")),
        PublishResult(stream="s", entry_id="1-0"),
    ]
    out = plan_outcomes(rows, results)
    assert out.held == ["oom", "oom-plain"]
    assert out.sent == ["ok"]
    assert [r.id for r in out.retry] == ["other"]
    assert out.dead == []
