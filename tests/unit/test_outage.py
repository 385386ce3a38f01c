"""``Outage``: one warning when a backend goes down, one when it is back, whatever the retries."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dispatcher.outage import Outage


def test_many_failures_of_one_outage_are_one_warning_and_its_end_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = Outage("Redis", clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="dispatcher.outage")

    for shard in range(8):
        assert outage.failed(RedisConnectionError("Error 111"), what=f"read shard {shard}")
    now[0] += 31
    outage.ok()
    outage.ok()

    assert [r.getMessage() for r in caplog.records] == [
        "Redis is down (read shard 0 failed: Error 111); retrying with backoff, quietly until "
        "it is back",
        "Redis is back after 31 s",
    ]
    caplog.clear()
    assert outage.failed(RedisConnectionError("Error 111"), what="read shard 0")
    assert [r.getMessage() for r in caplog.records] == [  # over: the next failure is a new one
        "Redis is down (read shard 0 failed: Error 111); retrying with backoff, quietly until "
        "it is back",
    ]


def test_an_error_that_is_no_outage_is_left_to_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage("Redis")

    assert not outage.failed(ResponseError("NOGROUP no such group"), what="read")
    assert caplog.records == []
    outage.ok()  # no outage began, so none ends
    assert caplog.records == []
