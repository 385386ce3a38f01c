"""The idle flag's decisions after each claim (pure: no session, an explicit clock)."""

from __future__ import annotations

from dispatcher.outbox.idle_flag import IdleDecider, IdlePolicy, Step

POLICY = IdlePolicy(
    busy_at_rows=2,
    idle_confirm_after=0.005,
    linger=0.002,
    blocked_claim_every=0.005,
    blocked_backoff_after=2.0,
    max_delay=1.0,
)


def claim(decider: IdleDecider, at: float, count: int = 0, **kw: bool) -> Step:
    state = {"full": False, "held": False, "listening": True, **kw}
    return decider.on_claim(count=count, started=at, ended=at + 0.001, **state)


def test_busy_claims_drop_the_flag_and_linger_between_partial_batches() -> None:
    decider = IdleDecider(POLICY, now=0.0)
    assert claim(decider, 1.0, count=5, held=True) == Step(drop=True, delay=POLICY.linger)
    assert claim(decider, 1.1, count=1) == Step(delay=POLICY.linger)
    assert claim(decider, 1.2, count=100, full=True) == Step(delay=0.0)
    assert claim(decider, 1.3, count=1, held=True) == Step(), "one row: NOTIFYs still come"


def test_two_spaced_empty_claims_try_the_flag_and_a_taken_flag_claims_once_more() -> None:
    decider = IdleDecider(POLICY, now=0.0)
    assert claim(decider, 1.0) == Step(delay=POLICY.idle_confirm_after)
    assert claim(decider, 1.003) == Step(delay=POLICY.idle_confirm_after), "too close"
    assert claim(decider, 1.01) == Step(take=True)
    assert decider.on_take(taken=True, ended=1.011) == 0.0
    assert claim(decider, 1.02, held=True) == Step(), "held: wait for a NOTIFY"


def test_without_a_listener_nothing_is_taken() -> None:
    decider = IdleDecider(POLICY, now=0.0)
    assert claim(decider, 1.0, listening=False) == Step()
    assert claim(decider, 1.1, listening=False) == Step()


def test_a_blocked_flag_keeps_claims_short_until_nothing_is_found_for_long() -> None:
    decider = IdleDecider(POLICY, now=0.0)
    claim(decider, 0.5, count=1)
    delays = []
    now = 0.51
    claim(decider, now)  # the first empty claim
    while now < 6.0:
        now += 0.01
        assert claim(decider, now) == Step(take=True)
        delays.append((now, decider.on_take(taken=False, ended=now)))
    early = [d for t, d in delays if t < 2.5]
    late = [d for t, d in delays if t > 5.0]
    assert set(early) == {POLICY.blocked_claim_every}, "claims every 5 ms while blocked"
    assert late[-1] == POLICY.max_delay, "then backs off, up to the poll interval"

    claim(decider, 6.1, count=1)  # a row found: short claims again
    claim(decider, 6.2)
    assert claim(decider, 6.3) == Step(take=True)
    assert decider.on_take(taken=False, ended=6.3) == POLICY.blocked_claim_every


def test_while_another_enqueuer_holds_the_flag_this_one_claims_once_a_poll() -> None:
    decider = IdleDecider(POLICY, now=0.0)
    assert claim(decider, 1.0) == Step(delay=POLICY.idle_confirm_after)
    assert claim(decider, 1.01) == Step(take=True)
    assert decider.on_take(taken=False, ended=1.011, elsewhere=True) == POLICY.max_delay
    # Standing by: whatever a claim finds, the flag is tried again and the next claim waits.
    assert claim(decider, 2.0, count=1, elsewhere=True) == Step(take=True)
    assert claim(decider, 3.0, elsewhere=True) == Step(take=True)
    assert decider.on_take(taken=False, ended=3.001, elsewhere=True) == POLICY.max_delay
    # A full batch is a backlog: every enqueuer drains it.
    assert claim(decider, 4.0, count=100, full=True, elsewhere=True) == Step(delay=0.0)
