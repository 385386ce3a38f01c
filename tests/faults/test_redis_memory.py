"""Redis fills up while workers are away: the outbox holds the backlog, nothing is charged.

Scenario 14. Redis has ``maxmemory 20mb`` and ``noeviction``; no worker runs
while 50,000 tasks of ~0.7 KB are committed (about twice what fits). The
enqueuer must stop claiming before Redis refuses writes (or at the first OOM
reply), leave the rest PENDING with no attempt counted and nothing in
``outbox_dlq``; workers started against the nearly full Redis must start and
drain everything, the enqueuer resuming as memory frees up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import psycopg

from dispatcher.demo.throwaway import RedisProcess
from tests.faults.harness import LONG, Pipeline
from tests.faults.load import LoadSpec
from tests.waiting import eventually_sync

TASKS = 50_000
PADDING = "x" * 560  # with the dispatch's own fields, ~0.7 KB per outbox payload


def test_redis_full_pauses_the_enqueuer_and_workers_drain_it_later(
    pipeline: Callable[..., Pipeline], own_redis: Callable[..., RedisProcess]
) -> None:
    redis = own_redis("--maxmemory", "20mb", "--maxmemory-policy", "noeviction")
    p = pipeline(redis.url)
    enqueuer = p.enqueuer("--batch-size", "100", "--maintenance-interval", "0.5")
    load = p.start_load(
        LoadSpec(
            tasks=TASKS,
            rate=20_000,
            writers=4,
            per_txn=(50, 100),
            task_input={"pad": PADDING},
            max_retries=3,
            backoff_seconds=1,
        )
    )
    load.wait()
    eventually_sync(lambda: "backpressure: Redis memory at" in enqueuer.tail(200), within=120)
    p.fault("enqueuer paused (backpressure)")
    pending_at_pause = _outbox(p.db_url)["pending"]
    assert pending_at_pause > 0, "all 50,000 fitted: the scenario did not fill Redis"

    # A while paused: several maintenance passes and retry backoffs go by; nothing is charged.
    time.sleep(5 if LONG else 3)
    state = _outbox(p.db_url)
    assert state["dlq"] == 0, state
    assert state["attempted"] == 0, f"attempts counted while Redis was full: {state}"
    assert state["pending"] > 0
    info = redis.cli("INFO", "memory")
    used = _field(info, "used_memory")
    assert used < _field(info, "maxmemory"), "Redis reached maxmemory: workers could not start"
    p.fault("OOM replies seen by Redis", _oom_replies(redis))
    status = subprocess.run(
        [
            sys.executable,
            *("-m", "dispatcher.cli", "status"),
            *("--database-url", p.db_url, "--redis-url", redis.url),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "BACKPRESSURE" in status, status

    # Workers start against the nearly full Redis, drain it; the enqueuer resumes.
    p.worker()
    p.worker()
    report = p.verify(within=600 if LONG else 300)
    assert report.dead_lettered == 0
    assert _outbox(p.db_url)["dlq"] == 0
    assert "backpressure off" in enqueuer.tail(10_000)


def _outbox(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status IN ('PENDING', 'RETRY')),"
            "       count(*) FILTER (WHERE attempt_count > 0),"
            "       (SELECT count(*) FROM outbox_dlq) FROM outbox"
        ).fetchone()
    assert row is not None
    return {"pending": int(row[0]), "attempted": int(row[1]), "dlq": int(row[2])}


def _field(info: str, name: str) -> int:
    for line in info.splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split(":", 1)[1])
    raise AssertionError(f"{name} not in INFO")


def _oom_replies(redis: RedisProcess) -> int:
    for line in redis.cli("INFO", "errorstats").splitlines():
        if line.startswith("errorstat_OOM:"):
            return int(line.split("count=", 1)[1].split(",")[0])
    return 0
