"""PostgreSQL-side faults under concurrent load: scenarios 4, 7, 11 and 12.

The LISTEN backend terminated in a loop, the server restarted (``pg_ctl
restart -m fast``), business transactions rolled back at random, and a long
idle transaction holding a snapshot while the enqueuer drains. The database is
the suite's own server (``pg_process``), never the machine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from tests.faults.harness import Pipeline, scale
from tests.faults.load import LoadSpec
from tests.waiting import eventually_sync

TERMINATE_LISTENERS = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE application_name = 'outbox-dispatcher-listener' AND datname = current_database()
"""
COUNT_LISTENERS = """
SELECT count(*) FROM pg_stat_activity
 WHERE application_name = 'outbox-dispatcher-listener' AND datname = current_database()
"""


def _listeners(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(COUNT_LISTENERS).fetchone()
    return int(row[0]) if row else 0


def test_listen_backend_terminated_in_a_loop(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.enqueuer("--poll-interval", "1")  # the backstop; LISTEN is what makes it fast
    p.worker()
    # On a loaded machine the whole load can end before the enqueuer has connected: then
    # there is no listener to terminate and the scenario tests nothing.
    eventually_sync(lambda: _listeners(p.db_url) > 0, within=60)
    load = p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    with psycopg.connect(p.db_url, autocommit=True) as admin:
        while not load.done:
            row = admin.execute(TERMINATE_LISTENERS).fetchone()
            p.fault("LISTEN backend terminated", int(row[0]) if row else 0)
            time.sleep(0.3)
    assert p.faults.get("LISTEN backend terminated", 0) > 0
    p.verify(within=s.drain_within)


def test_postgres_restarted_under_load(
    pipeline: Callable[..., Pipeline],
    own_redis: Callable[..., RedisProcess],
    pg_process: PostgresProcess,
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.enqueuer()
    p.enqueuer()
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate / 2))
    for _ in range(max(1, s.rounds // 2)):
        p.progress()
        pg_process.restart()
        p.fault("pg_ctl restart -m fast")
    p.verify(within=s.drain_within)


def test_business_transactions_rolled_back_at_random(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    p.enqueuer()
    p.worker()
    p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate, rollback=0.3))
    report = p.verify(within=s.drain_within)
    assert report.rolled_back > 0


def test_long_idle_transaction_holds_a_snapshot_while_the_enqueuer_drains(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    s = scale()
    p = pipeline(own_redis().url)
    with psycopg.connect(p.db_url) as holder:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM outbox")  # the snapshot, held idle from here
        holder_pid = holder.info.backend_pid
        p.enqueuer()
        p.worker()
        p.start_load(LoadSpec(tasks=s.tasks, rate=s.rate))
        p.verify(within=s.drain_within)
        with psycopg.connect(p.db_url, autocommit=True) as admin:
            state = _activity(admin, holder_pid)
            p.faults["outbox dead tuples kept by the snapshot"] = _dead_tuples(admin)
        assert state == ("idle in transaction", True), "the snapshot was held throughout"
        holder.rollback()


def _activity(admin: psycopg.Connection[Any], pid: int) -> tuple[str, bool] | None:
    row = admin.execute(
        "SELECT state, backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (str(row[0]), bool(row[1])) if row else None


def _dead_tuples(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'"
    ).fetchone()
    return int(row[0]) if row else 0
