"""Where outbox-dispatcher's CPU goes at idle (1 task / 20 ms), and the floor it stands on.

``python -m benchmarks.peers.idle_profile [--tasks 600] [--tree DIR] [--no-spy]`` (the bench
venv: py-spy needs ptrace, so root). It runs the idle scenario of ``benchmarks.peers.run`` on
outbox-dispatcher (this checkout, or ``--tree``'s ``dispatcher``) and prints:

- CPU per task of each process (user and system ms) and of each PostgreSQL session by its
  ``application_name`` (the producer's is the application's INSERT + COMMIT with the trigger);
- the round trips behind it (transactions, rows inserted and deleted, per task);
- py-spy's samples of the enqueuer and the worker (``--gil``: only while running Python),
  inclusive by function of the product, so each step's share of the process's CPU;
- the floor: the CPU of one bare round trip (``SELECT 1`` on psycopg, ``PING`` on redis-py,
  asyncio) after 20 ms idle and back to back, on the same servers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.peers.run import measure
from benchmarks.peers.systems import System, Variant, started
from benchmarks.workload import ROOT, _cpu_by_pid, backends, load_average

SPY = ROOT / ".venv-bench" / "bin" / "py-spy"
_STATS = (
    "SELECT xact_commit + xact_rollback, tup_inserted, tup_deleted FROM pg_stat_database"
    " WHERE datname = current_database()"
)


def _user_sys(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _sessions(system: System) -> dict[int, str]:
    with psycopg.connect(system.db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(pid): name or "?" for pid, name in rows}


def _stats(system: System) -> tuple[int, ...]:
    with psycopg.connect(system.db_url, autocommit=True) as conn:
        row = conn.execute(_STATS).fetchone()
    assert row is not None
    return tuple(int(v) for v in row)


def profile(tree: Path | None, tasks: int, spy: bool, out: Path) -> None:
    with started(Variant("outbox-dispatcher", tree or ROOT)) as system:
        names = {w.pid: w.args[3] for w in system.workers}  # enqueuer, worker
        time.sleep(3)
        spies = []
        if spy:
            for pid, name in names.items():
                argv = [str(SPY), "record", "--gil", "-r", "500", "-f", "raw",
                        "-o", str(out / f"{name}.txt"), "-p", str(pid)]  # fmt: skip
                spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(1)
        load = load_average()
        before = {pid: _user_sys(pid) for pid in names}
        pg_before, stats_before = _cpu_by_pid(backends(system.db_url)), _stats(system)
        result = measure(system, "idle", tasks, out)
        sessions = _sessions(system)
        pg_after, stats_after = _cpu_by_pid(backends(system.db_url)), _stats(system)
        after = {pid: _user_sys(pid) for pid in names}
        for s in spies:
            s.send_signal(2)
            s.wait()
    n = result["tasks"]
    print(f"idle, {n} tasks, load {load}; p50 {result['p50_ms']} ms; CPU ms/task "
          f"{result['cpu_ms_per_task']}")  # fmt: skip
    for pid, name in names.items():
        user, sys_ = (after[pid][i] - before[pid][i] for i in (0, 1))
        print(f"  {name}: user {user * 1000 / n:.3f}, system {sys_ * 1000 / n:.3f} ms/task")
    by_name: collections.Counter[str] = collections.Counter()
    for pid, cpu in pg_after.items():
        by_name[sessions.get(pid, "?")] += cpu - pg_before.get(pid, 0.0)
    for name, cpu in by_name.most_common():
        print(f"  PostgreSQL session {name or '?'}: {cpu * 1000 / n:.3f} ms/task")
    moved = [(b - a) / n for a, b in zip(stats_before, stats_after, strict=True)]
    print(f"  per task: {moved[0]:.2f} transactions, {moved[1]:.2f} rows inserted, "
          f"{moved[2]:.2f} deleted (the producer's INSERT and the journal's included)")  # fmt: skip
    for name in names.values():
        path = out / f"{name}.txt"
        if path.exists():
            _print_profile(name, path)


def _print_profile(name: str, path: Path, top: int = 25) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        for frame in set(stack.split(";")):
            if "dispatcher/" in frame:
                inclusive[frame] += int(count)
    print(f"  {name}: {total} samples running Python; the product's functions, inclusive:")
    for frame, count in inclusive.most_common(top):
        print(f"    {count * 100 / max(total, 1):5.1f} %  {frame[:110]}")


async def floor(db_url: str, redis_url: str, n: int = 250) -> dict[str, float]:
    """µs of this process's CPU per bare round trip, after 20 ms idle and back to back."""
    from dispatcher.redis_client import connect_redis

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    async def per(call: Any, gap: float) -> float:
        started = cpu()
        for _ in range(n):
            if gap:
                await asyncio.sleep(gap)
            await call()
        return (cpu() - started) * 1e6 / n

    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    client = connect_redis(redis_url)

    async def select() -> None:
        await (await conn.execute("SELECT 1")).fetchone()

    async def nothing() -> None:
        pass

    found = {}
    for gap in (0.02, 0.0):
        found[f"asyncio wake alone, gap {gap * 1000:.0f} ms"] = await per(nothing, gap)
        found[f"SELECT 1, gap {gap * 1000:.0f} ms"] = await per(select, gap)
        found[f"Redis PING, gap {gap * 1000:.0f} ms"] = await per(client.ping, gap)
    await conn.close()
    await client.aclose()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--tree", type=Path, default=None)
    parser.add_argument("--no-spy", action="store_true")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="od-peers-profile-"))
    profile(args.tree, args.tasks, not args.no_spy, out)
    with started(Variant("outbox-dispatcher", ROOT)) as system:
        assert system.redis is not None
        for what, us in asyncio.run(floor(system.db_url, system.redis.url)).items():
            print(f"  floor: {what}: {us:.0f} µs CPU")


if __name__ == "__main__":
    main()
