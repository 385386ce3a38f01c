"""The commit of one large application transaction while an enqueuer is idle, and while none is.

``python -m benchmarks.big_commit [--rows 200000] [--rounds 3]``

While an enqueuer holds the idle flag, inserts NOTIFY. Since migration 0010 the
trigger is one per statement with the empty payload, which PostgreSQL folds
into one notification per transaction: a transaction of many single-row INSERT
statements costs one notification at commit, not one per row (0008's row-level
trigger queued one per row: 4.9 s and 261 MB of backend memory for 200,000 rows).
The flag is held here by a session of the benchmark's own, as an idle enqueuer
holds it. Prints the commit's seconds and the backend's peak memory growth per
arm, alternating the arms round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psycopg

from benchmarks.env import bench_env, machine_facts
from dispatcher.outbox.idle_flag import IDLE_FLAG_KEY

# Each row its own INSERT statement, as an application's loop would send them.
INSERTS = """
DO $$
BEGIN
    FOR i IN 1..%s LOOP
        INSERT INTO outbox (id, task_id, stream, payload, type)
        VALUES (gen_random_uuid()::text, 'big-' || i, 'workflow.tasks.big',
                '{"task_id": "b", "input": "{}"}', 'TASK_EXECUTION');
    END LOOP;
END $$
"""


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def commit_seconds(db_url: str, rows: int, *, idle: bool) -> tuple[float, int]:
    """Seconds the COMMIT of a ``rows``-statement transaction takes, and the backend's peak
    memory (kB), with the idle flag held by another session or not."""
    with psycopg.connect(db_url, autocommit=True) as flag:
        if idle:
            flag.execute("SELECT pg_advisory_lock(%s)", (IDLE_FLAG_KEY,))
            flag.execute("LISTEN outbox_new")  # as the idle enqueuer listens
        with psycopg.connect(db_url) as app:
            pid = app.info.backend_pid
            local = os.path.exists(f"/proc/{pid}/status")
            app.execute(INSERTS % int(rows))
            started = time.perf_counter()
            app.commit()
            elapsed = time.perf_counter() - started
            peak = _rss_kb(pid) if local else 0
        with psycopg.connect(db_url, autocommit=True) as clean:
            clean.execute("TRUNCATE outbox")
    return elapsed, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine_facts())
    results: dict[str, list[tuple[float, int]]] = {"no enqueuer idle": [], "an enqueuer idle": []}
    with bench_env() as env:
        for _ in range(args.rounds):
            for arm, idle in (("no enqueuer idle", False), ("an enqueuer idle", True)):
                results[arm].append(commit_seconds(env.db_url, args.rows, idle=idle))
    print(f"COMMIT of one transaction of {args.rows:,} single-row INSERTs, {args.rounds} rounds")
    print(f"load average at the end: {os.getloadavg()}")
    for arm, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        peak = max(p for _, p in runs) / 1024
        print(f"  {arm:18} commit {seconds * 1000:8.1f} ms (median), backend peak {peak:.0f} MB")


if __name__ == "__main__":
    main()
