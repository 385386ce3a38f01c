"""The peer benchmark's harness: scenarios x systems, interleaved, into peers.json and peers.png.

``python -m benchmarks.peers.run [--quick] [--rounds N] [--only SYSTEM ...]
[--ours NAME=TREE ...]`` (``make bench-peers`` builds what it needs and runs it).

Scenarios (no-op tasks; the clock of a task runs from its producer's commit returning to its
handler starting, both ``CLOCK_REALTIME`` on this machine):

- ``1/commit``: 4 producer processes (a connection each) commit one task per transaction,
  as fast as they can; ``--tasks`` in all.
- ``100/commit``: the same, 100 tasks per transaction.
- ``idle``: one producer commits one task, then idles 20 ms; ``--idle-tasks`` in all.

Each round runs every scenario once per system, the systems' order rotating from round to
round; the load average is recorded for each run. CPU per task: what the system's worker
processes, every backend of its database (its workers' and its producers' sessions) and its
redis-server spent from the producers' start to the last task handled, over the tasks;
producer processes and PostgreSQL's shared background work are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.env import machine_facts
from benchmarks.peers.plot import plot
from benchmarks.peers.systems import CONCURRENCY, MAX_WORKERS_RIVER, PEERS, System, Variant, started
from benchmarks.workload import ROOT, CpuMeter

RESULTS = ROOT / "benchmarks" / "results"
PRODUCERS = 4
GAP_MS = 20
WARM = 20  # tasks through the whole path before a measure (connections, plans, groups)
TIMEOUT = 600.0

SCENARIOS = {
    "1/commit": (1, 0, PRODUCERS),
    "100/commit": (100, 0, PRODUCERS),
    "idle": (1, GAP_MS, 1),
}


def _handled(system: System, prefix: str) -> dict[str, int]:
    out = {}
    for line in system.handled_log.read_text().splitlines():
        task, _, ns = line.partition(" ")
        if task.startswith(prefix) and ns:
            out.setdefault(task, int(ns))  # a duplicate delivery counts once, its first start
    return out


def _wait_handled(system: System, prefix: str, count: int) -> dict[str, int]:
    deadline = time.monotonic() + TIMEOUT
    while True:
        found = _handled(system, prefix)
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"{system.name}: {len(found)} of {count} tasks handled")
        for worker in system.workers:
            if worker.poll() is not None:
                raise RuntimeError(f"{system.name}: a worker exited ({worker.returncode})")
        time.sleep(0.05)


def _producers(system: System, tasks: int, per_commit: int, gap: int, n: int, tag: str,
               workdir: Path) -> list[tuple[subprocess.Popen[str], Path]]:  # fmt: skip
    env = {**os.environ, **system.env}
    out = []
    for k in range(n):
        log = workdir / f"{tag}{k}.commits"
        argv = [*system.producer, str(tasks // n), str(per_commit), str(gap), f"{tag}{k}", str(log)]
        proc = subprocess.Popen(argv, cwd=system.cwd, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        out.append((proc, log))
    for proc, _ in out:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{system.name}: a producer did not start ({proc.wait()})")
    return out


def _go(producers: list[tuple[subprocess.Popen[str], Path]]) -> None:
    for proc, _ in producers:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _finish(producers: list[tuple[subprocess.Popen[str], Path]]) -> dict[str, int]:
    commits: dict[str, int] = {}
    for proc, log in producers:
        assert proc.stdout is not None
        assert proc.stdin is not None
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"a producer failed ({proc.wait()})")
        proc.stdin.close()
        proc.wait(30)
        for line in log.read_text().splitlines():
            task, _, ns = line.partition(" ")
            commits[task] = int(ns)
    return commits


def measure(system: System, scenario: str, tasks: int, workdir: Path) -> dict[str, Any]:
    per_commit, gap, n = SCENARIOS[scenario]
    warm = _producers(system, WARM, 1, 0, 1, "warm", workdir)
    _go(warm)
    _finish(warm)
    _wait_handled(system, "warm", WARM)

    producers = _producers(system, tasks, per_commit, gap, n, "p", workdir)
    load = os.getloadavg()[0]
    meter = CpuMeter(system.db_url, product={w.pid for w in system.workers},
                     redis_pid=system.redis_pid)  # fmt: skip
    started_ns = time.time_ns()
    _go(producers)
    handled = _wait_handled(system, "p", tasks - tasks % n)
    spent = meter.spent()
    commits = _finish(producers)

    latencies = sorted((handled[t] - commits[t]) / 1e6 for t in handled)
    seconds = (max(handled.values()) - started_ns) / 1e9
    count = len(handled)
    cpu = {side: spent[side] * 1000 / count for side in spent}
    return {
        "load1": round(load, 2),
        "tasks": count,
        "tasks_per_s": round(count / seconds, 1),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
        "cpu_ms_per_task": {k: round(v, 4) for k, v in {**cpu, "total": sum(cpu.values())}.items()},
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per scenario, per system: the medians over its rounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for scenario, system in dict.fromkeys((r["scenario"], r["system"]) for r in runs):
        mine = [r for r in runs if r["scenario"] == scenario and r["system"] == system]
        out.setdefault(scenario, {})[system] = {
            "tasks_per_s": statistics.median(r["tasks_per_s"] for r in mine),
            "p50_ms": statistics.median(r["p50_ms"] for r in mine),
            "p99_ms": statistics.median(r["p99_ms"] for r in mine),
            "cpu_ms_per_task": statistics.median(r["cpu_ms_per_task"]["total"] for r in mine),
            "load1": statistics.median(r["load1"] for r in mine),
            "rounds": len(mine),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--idle-tasks", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true", help="1 round, 4,000 tasks, 300 idle")
    parser.add_argument("--only", nargs="*", default=None, help="systems to run (names)")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--ours", action="append", default=[], metavar="NAME=TREE",
                        help="outbox-dispatcher from another source tree (repeatable)")  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS / "peers.json"))
    parser.add_argument("--render", action="store_true", help="redraw --out's figures only")
    args = parser.parse_args()
    if args.render:
        write_figures(Path(args.out))
        return
    if args.quick:
        args.rounds, args.tasks, args.idle_tasks = 1, 4_000, 300

    variants = [Variant("outbox-dispatcher", ROOT)]
    for spec in args.ours:
        name, _, tree = spec.partition("=")
        variants.append(Variant(name, Path(tree)))
    variants += [Variant(p) for p in PEERS]
    if args.only:
        variants = [v for v in variants if v.name in args.only]

    uptime_start = subprocess.getoutput("uptime").strip()
    runs: list[dict[str, Any]] = []
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"od-peers-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.rounds):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for scenario in args.scenarios:
            tasks = args.idle_tasks if scenario == "idle" else args.tasks
            for variant in order:
                with started(variant) as system:
                    result = measure(system, scenario, tasks, workdir)
                run = {"round": round_ + 1, "scenario": scenario, "system": variant.name, **result}
                runs.append(run)
                print(json.dumps(run), flush=True)

    document = {
        "machine": {
            **machine_facts(),
            "uptime_start": uptime_start,
            "uptime": subprocess.getoutput("uptime").strip(),
        },
        "settings": settings(args),
        "summary": _summary(runs),
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    write_figures(out)


def write_figures(path: Path) -> None:
    """``peers.png`` and ``peers.md`` (the table) beside the results file ``path``."""
    document = json.loads(path.read_text())
    plot(document, path.with_suffix(".png"))
    path.with_suffix(".md").write_text(render(document))
    print(f"wrote {path}, {path.with_suffix('.png')} and {path.with_suffix('.md')}")


def render(document: dict[str, Any]) -> str:
    """The results as a markdown table (medians; ratios to River), with the settings."""
    summary, facts = document["summary"], document["machine"]
    systems = list(dict.fromkeys(s for cells in summary.values() for s in cells))
    lines = [
        "# Beside the peers (`make bench-peers`)",
        "",
        f"{facts['date']}; {facts['machine']}; PostgreSQL {facts['postgresql']}, Redis "
        f"{facts['redis']}, Python {facts['python']}; `uptime` at the start: "
        f"{facts.get('uptime_start', '?')}; at the end: {facts['uptime']}.",
        "Medians over the rounds; x River: the system's figure over River's; load: the 1-minute"
        " load average when each run started (the machine is shared: read ratios, not absolutes).",
        "",
        "| scenario | system | tasks/s | p50 ms | p99 ms | CPU ms/task | x River (CPU) "
        "| x River (p50) | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, cells in summary.items():
        river = cells.get("River")
        for system in systems:
            cell = cells.get(system)
            if cell is None:
                continue
            cpu_x = f"{cell['cpu_ms_per_task'] / river['cpu_ms_per_task']:.2f}" if river else ""
            p50_x = f"{cell['p50_ms'] / river['p50_ms']:.2f}" if river else ""
            lines.append(
                f"| {scenario} | {system} | {cell['tasks_per_s']:,.0f} | {cell['p50_ms']:.1f} "
                f"| {cell['p99_ms']:.1f} | {cell['cpu_ms_per_task']:.3f} | {cpu_x} | {p50_x} "
                f"| {cell['load1']:.2f} |"
            )
    lines += ["", "Settings:", ""]
    lines += [f"- {key}: {value}" for key, value in document["settings"].items()]
    return "\n".join(lines) + "\n"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tasks": args.tasks,
        "idle_tasks": args.idle_tasks,
        "rounds": args.rounds,
        "producers": PRODUCERS,
        "idle_gap_ms": GAP_MS,
        "worker_concurrency": CONCURRENCY,
        "outbox-dispatcher": "dispatcher enqueuer (defaults) + dispatcher worker --concurrency 16"
        " (4 shards), Redis AOF everysec",
        "River": f"river v0.51.2, riverpgxv5, defaults but MaxWorkers {MAX_WORKERS_RIVER};"
        " InsertTx / InsertManyTx in the producer's transaction",
        "procrastinate": "procrastinate 3.x worker --concurrency 16 (LISTEN/NOTIFY on);"
        " defer_async / batch_defer_async in the producer's transaction",
        "Celery": "celery 5.x worker -P threads -c 16, Redis broker (AOF everysec), results"
        " ignored; no transaction (delay() per task)",
        "cpu": "worker processes + every backend of the system's database (workers' and"
        " producers' sessions) + its redis-server; producer processes excluded",
    }


if __name__ == "__main__":
    main()
