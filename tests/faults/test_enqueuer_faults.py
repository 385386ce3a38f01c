"""Enqueuer processes killed, paused, and run side by side, under concurrent load.

Scenarios 1-3 of the fault suite. Each runs real ``dispatcher enqueuer`` and
``dispatcher worker`` processes against the suite's own PostgreSQL and a
redis-server of the test's own, and ends with the checker's verdict: nothing
committed lost, nothing rolled back handled, no duplicate handler runs, no row
in flight, every stream and PEL empty.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable

import psycopg

from dispatcher.demo.throwaway import RedisProcess
from tests.faults.harness import Pipeline, scale
from tests.faults.load import LoadSpec
from tests.waiting import eventually_sync

RECOVERY_AGE = 3.0  # --hung-batch-timeout of ENQUEUER_FLAGS


def in_flight(db_url: str) -> int:
    """Rows held by batches in progress (their journal rows)."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox_batches"
            " WHERE pg_xact_status(xact) = 'in progress'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_enqueuer_sigkilled_repeatedly_during_a_drain(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.worker()
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate))
    rng = random.Random(1)
    for _ in range(s.rounds + 1):
        victim = p.enqueuer()
        # Let it claim and publish (progress downstream), then kill it at a random moment.
        p.progress(by=1, within=30)
        time.sleep(rng.uniform(0.0, 0.3))
        victim.kill()
        p.fault("enqueuer SIGKILL")
    p.enqueuer(name="survivor")
    p.verify(within=s.drain_within)


def test_enqueuer_sigstopped_past_the_recovery_age_then_continued(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    paused = p.enqueuer(name="paused")
    p.enqueuer(name="steady")
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    for _ in range(max(1, s.rounds // 3)):
        eventually_sync(lambda: p.handled() > 0, within=30)
        paused.signal(signal.SIGSTOP)
        p.fault("enqueuer SIGSTOP")
        p.fault("rows in flight at SIGSTOP", in_flight(p.db_url))
        time.sleep(RECOVERY_AGE + 1.5)  # the fault: frozen past the recovery age
        paused.signal(signal.SIGCONT)
    p.verify(within=s.drain_within)


def test_three_enqueuers_at_once(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    for _ in range(3):
        p.enqueuer("--batch-size", "10")
    p.worker()
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate * 2))
    p.verify(within=s.drain_within)
