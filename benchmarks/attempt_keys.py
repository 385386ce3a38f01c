"""Task attempts' Redis work: ``python -m benchmarks.attempt_keys [--baseline DIR]``.

What it measures: what the worker's duplicate suppression (``dedup.py``) costs
per task attempt on standalone Redis and on a 3-master Redis Cluster: a read
batch's claim (``AttemptGuard.claim_many``) and its done marks
(``mark_done_many``), ``--batch`` attempts at a time, every attempt new (the
common case). Per attempt: wall time, the client's CPU and the Redis servers'
CPU (all the Cluster's nodes), from /proc. Nothing else runs: no streams, no
handler; the worker benchmark (``worker_consume``) has the whole worker.

How: one redis-server and one Cluster of its own; per round and variant a
child process (this file, run with ``--child`` from the checkout under test,
so it imports that checkout's ``dispatcher``) claims and marks ``--attempts``
attempts; the databases are flushed between runs. ``--baseline DIR`` adds the
same from another checkout (``git worktree add --detach /tmp/before <commit>``),
interleaved. Prints a markdown table and writes ``results/attempt_keys.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "attempt_keys.md"


async def child(url: str, *, cluster: bool, attempts: int, batch: int) -> dict[str, float]:
    """Claim and mark done ``attempts`` new attempts; wall and CPU microseconds per attempt."""
    from dispatcher.redis_client import connect_redis
    from dispatcher.worker.dedup import AttemptGuard

    client = connect_redis(url, cluster=cluster)
    guard = AttemptGuard(client, owner="bench", lease_ttl_ms=30_000, done_ttl_ms=86_400_000)
    await guard.claim_many(["warm-up:1"])  # scripts loaded, connections open
    run = uuid.uuid4().hex[:8]
    started, cpu = time.perf_counter(), time.process_time()
    for first in range(0, attempts, batch):
        keys = [f"{run}:task-{n}:1" for n in range(first, min(attempts, first + batch))]
        claims = await guard.claim_many(keys)
        assert claims == [1] * len(keys), claims[:5]
        await guard.mark_done_many(keys)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    await client.aclose()
    return {"wall_us": wall / attempts * 1e6, "client_cpu_us": cpu / attempts * 1e6}


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def one_run(
    checkout: Path, url: str, pids: list[int], *, cluster: bool, attempts: int, batch: int
) -> dict[str, float]:
    """The child from ``checkout`` against one server (``pids``: its processes)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", url]
    command += ["--attempts", str(attempts), "--batch", str(batch)]
    command += ["--cluster"] if cluster else []
    before = cpu_seconds(pids)
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr.strip()[-2000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    # Start-up and the warm-up are in the servers' CPU too: a few ms against seconds.
    found["redis_cpu_us"] = (cpu_seconds(pids) - before) / attempts * 1e6
    return found


def flush(url_ports: list[int]) -> None:
    for port in url_ports:
        subprocess.run(
            ["redis-cli", "-p", str(port), "FLUSHALL"], capture_output=True, check=True, timeout=30
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=300, help="attempts per claim (a read batch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout to run as well")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())  # the checkout under test, not this file's
        found = asyncio.run(
            child(args.child, cluster=args.cluster, attempts=args.attempts, batch=args.batch)
        )
        print(json.dumps(found))
        return

    sys.path.insert(0, str(ROOT))
    from dispatcher.demo.throwaway import RedisProcess
    from tests.redis_cluster import RedisClusterProcess

    checkouts = {"this checkout": ROOT}
    if args.baseline is not None:
        checkouts["baseline"] = args.baseline.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-attempts-"))
    standalone = RedisProcess(workdir / "standalone").start()
    cluster = RedisClusterProcess(workdir / "cluster").start()
    pids = [node.proc.pid for node in (standalone, *cluster.nodes) if node.proc is not None]
    servers = {
        "standalone": (standalone.url, pids[:1], [standalone.port], False),
        "Cluster, 3 masters": (
            cluster.url,
            pids[1:],
            [n.port for n in cluster.nodes],
            True,
        ),
    }
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        for r in range(args.rounds):
            for topology, (url, pids, ports, is_cluster) in servers.items():
                for name, checkout in checkouts.items():
                    print(f"round {r + 1}/{args.rounds}: {topology}, {name}", file=sys.stderr)
                    found = one_run(
                        checkout,
                        url,
                        pids,
                        cluster=is_cluster,
                        attempts=args.attempts,
                        batch=args.batch,
                    )
                    print(f"  {found}", file=sys.stderr)
                    samples.setdefault((topology, name), []).append(found)
                    flush(ports)
    finally:
        standalone.kill()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    table = render(samples, args)
    print(table)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(table)


def render(samples: dict[tuple[str, str], list[dict[str, float]]], args: argparse.Namespace) -> str:
    lines = [
        "# Task attempts' Redis work: claim + done mark per attempt",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores; Python {platform.python_version()}",
        f"- {args.attempts:,} new attempts per run, {args.batch} per claim; {args.rounds} rounds, "
        "variants interleaved; medians (min-max), µs per attempt",
        f"- reproduce: `python -m benchmarks.attempt_keys {' '.join(sys.argv[1:])}`",
        "",
        "| Redis | code | wall | client CPU | Redis CPU |",
        "|---|---|---:|---:|---:|",
    ]
    for (topology, name), found in samples.items():
        cells = []
        for key in ("wall_us", "client_cpu_us", "redis_cpu_us"):
            values = [f[key] for f in found]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        lines.append(f"| {topology} | {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
