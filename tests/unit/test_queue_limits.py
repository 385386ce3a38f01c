"""Queue limits as values: what a limits key may hold, and the tokens a bucket has left."""

from __future__ import annotations

import pytest

from dispatcher.cli.main import main
from dispatcher.status import StatusReport, render_text
from dispatcher.stream.limit_keys import (
    InvalidLimits,
    LimitUsage,
    QueueLimits,
    limits_key,
    parse_limits,
    queue_of_limits_key,
    tokens_left,
)


def test_a_limits_key_round_trips() -> None:
    limits = QueueLimits(max_in_flight=4, rate=20, burst=5)
    assert parse_limits(limits.to_json(), source="k") == limits
    assert limits.describe() == "max in flight 4, rate 20/s burst 5"
    assert queue_of_limits_key(limits_key("emails")) == "emails"
    assert queue_of_limits_key("composer:limits:emails") is None


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"max_in_flight": -1}', "max_in_flight: Input should be greater than or equal to 1"),
        ('{"max_in_flight": 0}', "greater than or equal to 1"),
        ('{"burst": 5}', "burst requires rate"),
        ('{"rate": 0}', "rate: Input should be greater than or equal to 0.001"),
        ('{"rate": "Infinity"}', "rate"),
        ('{"max_in_flight": 1.5}', "max_in_flight"),
        ('{"max": 3}', "max: Extra inputs are not permitted"),
        ("not json", "Invalid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        ("[]", "Input should be an object"),
    ],
)
def test_a_limits_key_that_is_not_limits_names_the_key_and_why(raw: str | bytes, says: str) -> None:
    with pytest.raises(InvalidLimits) as caught:
        parse_limits(raw, source="composer:limits:{q}")
    assert str(caught.value).startswith("composer:limits:{q} holds invalid limits")
    assert says in str(caught.value)


def test_the_bucket_holds_burst_tokens_and_refills_at_the_rate() -> None:
    limits = QueueLimits(rate=20, burst=5)  # a token every 50 ms
    assert tokens_left(limits, tat_ms=None, now_ms=1000) == 5
    assert tokens_left(limits, tat_ms=1000 + 250, now_ms=1000) == 0  # five taken just now
    assert tokens_left(limits, tat_ms=1000 + 250, now_ms=1100) == 2
    assert tokens_left(limits, tat_ms=1000 + 230, now_ms=1000) == 0  # the next comes in 30 ms
    assert tokens_left(QueueLimits(max_in_flight=2), tat_ms=None, now_ms=0) is None


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--clear", "--burst", "5"], "invalid limits for q: burst requires rate"),
        (["--burst", "0"], "--burst"),
        ([], "nothing to set"),
        (["--max-in-flight", "-1"], "--max-in-flight"),
        (["--rate", "nan"], "--rate"),
    ],
)
def test_limits_set_refuses_nonsense_in_one_line(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # never reached
    try:
        code = main(["limits", "set", "--queue", "q", *flags])
    except SystemExit as exc:  # argparse refuses a bad number itself
        code = int(str(exc.code))
    assert code == 2
    assert says in capsys.readouterr().err


def test_status_shows_each_queue_s_limits_and_their_use() -> None:
    usage = LimitUsage("emails", QueueLimits(max_in_flight=4, rate=20, burst=5), 3, 2)
    report = StatusReport(
        outbox={},
        oldest_pending_age_seconds=None,
        dlq=0,
        stream_shards=4,
        group="workers",
        streams=[],
        dead_letters={},
        limits=[usage, LimitUsage("bad", None, 0, None, error="composer:limits:{bad} holds x")],
    )
    text = render_text(report)
    assert "limits of emails: max in flight 4, rate 20/s burst 5; in flight 3/4; tokens 2/5" in text
    assert "limits of bad: INVALID (workers keep what they last read)" in text
    assert report.to_json()["limits"][0] == {
        "queue": "emails",
        "limits": {"max_in_flight": 4, "rate": 20.0, "burst": 5},
        "in_use": 3,
        "tokens": 2,
        "error": None,
    }
