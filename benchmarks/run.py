"""Run every benchmark figure in one run: ``python -m benchmarks.run [--rounds 3] [--only NAME]``.

Each figure has variants (the product and its baselines) that run interleaved
(A, B, C, A, B, C, ...) so drift on the machine hits them alike; each number
is the median of its rounds. The product runs as its own process with its
defaults, as in production. Results go to stdout and ``benchmarks/RESULTS.md``
(only for a full run: not with ``--only`` or ``--quick``). ``--quick`` runs
every figure small and once, to check the harness during development.
Not part of CI: it takes minutes and its numbers are only meaningful on a
quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import drain, hops, probe, soak
from benchmarks import enqueuer_bench as eb
from benchmarks import handled_latency as hl
from benchmarks import insert_bench as ib
from benchmarks import isolation_bench as xb
from benchmarks import worker_consume as wc
from benchmarks.env import BenchEnv, bench_env, machine_facts
from benchmarks.workload import LARGE, SMALL, TINY, load_average
from dispatcher.outbox import EnqueuerConfig

Variant = Callable[[BenchEnv], Any]
Figures = dict[str, tuple[str, dict[str, Variant]]]
_DEFAULTS = EnqueuerConfig()
ENQUEUER = "enqueuer"
FLOOR = "NOTIFY receipt floor"
FORGED = "enqueuer, after 1,000 forged notifications"
RELAY = "pipelined relay"
SQL_ONLY = "spec SQL-only claim->delete"
BARE = "bare XREADGROUP + XACK/XDEL"
WORKER = "dispatcher worker"
LIMITED = "dispatcher worker, queue limits set, not binding"
ONCE = {"duplicates"}  # one round: 10,000 dispatches at 20 ms are minutes already


@dataclass(frozen=True)
class Scale:
    """How much each figure does: the recorded run, or ``--quick`` for development."""

    samples: int = probe.SAMPLES
    dispatches: int = 10_000
    rows: int = drain.ROWS
    messages: int = 200_000


QUICK = Scale(samples=40, dispatches=200, rows=5_000, messages=10_000)


RECORDED = (
    "hops", "idle_latency", "duplicates", f"drain_{SMALL}", f"drain_{LARGE}", "worker",
    "worker_limits", "handled_latency", "insert_tps_16",
)  # fmt: skip


def figures(scale: Scale) -> Figures:
    """Every figure of the recorded run, in the order it runs."""
    batch = f"batch {_DEFAULTS.batch_size}, {_DEFAULTS.concurrency} connections"
    found: Figures = {
        "hops": (
            "one round trip between processes, back to back and 20 ms apart (the idle "
            "probe's pace): what each cold hop of an idle dispatch costs here (µs)",
            {
                "back to back": partial(hops.round_trips, gap=0.0),
                "20 ms apart": partial(hops.round_trips, gap=hops.GAP),
            },
        ),
        "idle_latency": (
            "commit -> entry in Redis at idle: one realistic dispatch (433 B) every 20 ms, "
            "a reader blocked on XREAD, the relay its own process (ms)",
            {
                ENQUEUER: partial(probe.idle_enqueuer, samples=scale.samples),
                FORGED: partial(probe.idle_enqueuer, samples=scale.samples, garbage=1000),
                FLOOR: partial(probe.idle_enqueuer, samples=scale.samples, clock="notify"),
                RELAY: partial(probe.idle_relay, samples=scale.samples),
            },
        ),
        "duplicates": (
            f"stream entries published twice, {scale.dispatches:,} idle dispatches (one round)",
            {
                "1 enqueuer": partial(probe.duplicates, enqueuers=1, dispatches=scale.dispatches),
                "2 enqueuers": partial(probe.duplicates, enqueuers=2, dispatches=scale.dispatches),
            },
        ),
    }
    for size in (SMALL, LARGE):
        found[f"drain_{size}"] = (
            f"drain of {scale.rows:,} pre-filled rows, {size} B payloads ({batch}); "
            "CPU per row from /proc",
            {
                ENQUEUER: partial(drain.enqueuer, size=size, rows=scale.rows),
                SQL_ONLY: partial(drain.sql_only, size=size, rows=scale.rows),
                RELAY: partial(drain.relay, size=size, rows=scale.rows),
            },
        )
    found["worker"] = (
        f"worker on no-op handlers: {scale.messages:,} realistic messages over "
        f"{wc.SHARDS} shards, leases and dedup on, defaults; CPU per message from /proc",
        {
            WORKER: wc.figure(wc.workers(1), scale.messages),
            BARE: wc.figure(wc.bare, scale.messages),
        },
    )
    found["worker_limits"] = (
        f"worker on no-op handlers, queue limits (max_in_flight, rate, burst) set but never "
        f"binding against none: {scale.messages:,} messages, 1 process, as `worker`",
        {
            WORKER: wc.figure(wc.workers(1), scale.messages),
            LIMITED: wc.figure(wc.workers(1, limits=wc.LOOSE_LIMITS), scale.messages),
        },
    )
    found["handled_latency"] = hl.figure()  # procrastinate: needs .venv-bench (see module)
    found["insert_tps_16"] = (
        "business INSERT tps, 16 pgbench clients, enqueuer running",
        {v: partial(ib.insert_tps, variant=v, clients=16) for v in ib.TRIGGERS},
    )
    return found


# Figures of earlier work, not in the recorded run: ``--only NAME`` runs one.
EARLIER: Figures = {
    "insert_tps_4": (
        "business INSERT tps, 4 pgbench clients, enqueuer running",
        {v: partial(ib.insert_tps, variant=v, clients=4) for v in ib.TRIGGERS},
    ),
    "latency_1k": (
        "commit -> entry in Redis at ~1,000 rows/s offered (ms, 1 ms resolution)",
        {"enqueuer": partial(eb.latency_under_load, variant="pipelined")},
    ),
    "drain_in_process": (
        f"drain of 50,000 pre-filled rows by an enqueuer in the benchmark's process "
        f"(batch {_DEFAULTS.batch_size}, concurrency {_DEFAULTS.concurrency})",
        {
            "enqueuer": partial(eb.drain, variant="pipelined"),
            "spec relay (spec SQL, per-row XADD)": eb.spec_relay,
            "spec SQL-only claim->delete, spec table": partial(eb.sql_only_cycle, schema="spec"),
            "enqueuer, per-row XADD": partial(eb.drain, variant="per-row"),
        },
    ),
    "drain_processes": (
        "drain of 50,000 rows by enqueuer processes (cores: CPU each side kept busy, of 2)",
        {
            "2 enqueuers": partial(eb.drain_processes, processes=2),
            "1 enqueuer": partial(eb.drain_processes, processes=1),
        },
    ),
    "flag_blocked": (
        "commit -> entry in Redis while another session's open transaction has inserted an "
        "outbox row (ms, 1 ms resolution)",
        {
            f"{rate}, {held}": partial(xb.flag_blocked, rate=rate, held=held)
            for rate in xb.RATES
            for held in ("none", "none after draining", "opened while draining", "open at start")
        },
    ),
    "not_yet_due": (
        "idle commit -> entry in Redis, with rows scheduled for later in the outbox (ms)",
        {
            "none waiting": partial(xb.not_yet_due, waiting=0),
            "200k not yet due": partial(xb.not_yet_due, waiting=200_000),
        },
    ),
}


def _keep(
    keys: tuple[str, ...], measure: Variant, renamed: dict[str, str] | None = None
) -> Variant:
    """``measure`` reporting only ``keys`` (after ``renamed``); a key it lacks is NaN."""

    async def run(env: BenchEnv) -> dict[str, float]:
        found = await _call(measure, env)
        found = {(renamed or {}).get(k, k): v for k, v in found.items()}
        return {k: found.get(k, float("nan")) for k in keys}

    return run


def explain(scale: Scale) -> Figures:
    """Why the earlier harness's absolute figures were 2-5x better than a probe from outside:
    each variant changes one thing (``--only explain_idle --only explain_drain``)."""
    idle_keys = ("p50_insert_ms", "p50_commit_ms", "p99_commit_ms")
    earlier = {"p50_ms": "p50_commit_ms", "p99_ms": "p99_commit_ms"}
    rows = scale.rows
    return {
        "explain_idle": (
            "idle commit -> entry in Redis, one change at a time from the earlier harness (ms)",
            {
                "earlier: enqueuer in the probe's process, ~150 B, from commit ack": _keep(
                    idle_keys,
                    partial(eb.idle_latency, variant="pipelined", samples=scale.samples, size=TINY),
                    earlier,
                ),
                "enqueuer process, ~150 B": _keep(
                    idle_keys, partial(probe.idle_enqueuer, samples=scale.samples, tiny=True)
                ),
                "enqueuer process, 433 B": _keep(
                    idle_keys, partial(probe.idle_enqueuer, samples=scale.samples)
                ),
            },
        ),
        "explain_drain": (
            f"drain of {rows:,} pre-filled rows, one change at a time from the earlier harness",
            {
                "SQL-only, earlier: ~150 B, one created_at, batch 100": partial(
                    drain.sql_only, rows=rows, size=TINY, step_us=0
                ),
                "SQL-only, 512 B, one created_at": partial(
                    drain.sql_only, rows=rows, size=SMALL, step_us=0
                ),
                "SQL-only, 512 B": partial(drain.sql_only, rows=rows, size=SMALL),
                "SQL-only, 512 B, batch 50": partial(
                    drain.sql_only, rows=rows, size=SMALL, batch=50
                ),
                "SQL-only, 512 B, dead tuples of a drain before": partial(
                    drain.sql_only, rows=rows, size=SMALL, fresh=False
                ),
                "enqueuer, earlier: in the bench's process, ~150 B, one created_at": _keep(
                    ("rows_per_s",), partial(eb.drain, variant="pipelined", rows=rows, size=TINY)
                ),
                "enqueuer process, ~150 B, one created_at": partial(
                    drain.enqueuer, rows=rows, size=TINY, step_us=0
                ),
                "enqueuer process, 512 B, one created_at": partial(
                    drain.enqueuer, rows=rows, size=SMALL, step_us=0
                ),
                "enqueuer process, 512 B": partial(drain.enqueuer, rows=rows, size=SMALL),
                "enqueuer process, 512 B, dead tuples of a drain before": partial(
                    drain.enqueuer, rows=rows, size=SMALL, fresh=False
                ),
            },
        ),
    }


FIGURES: Figures = figures(Scale()) | EARLIER | explain(Scale())


async def _call(measure: Variant, env: BenchEnv) -> dict[str, float]:
    result = measure(env)
    if inspect.isawaitable(result):
        result = await result
    return dict(result)


async def measure_all(
    env: BenchEnv, figs: Figures, rounds: int, only: set[str]
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, (_, variants) in figs.items():
        if (only and name not in only) or (not only and name not in RECORDED):
            continue
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        its_rounds = 1 if name in ONCE else rounds
        for r in range(its_rounds):
            for variant, measure in variants.items():
                print(f"[{name}] round {r + 1}/{its_rounds}: {variant} (load {load_average()})",
                      file=sys.stderr, flush=True)  # fmt: skip
                runs[variant].append(await _call(measure, env))
                print(f"    {runs[variant][-1]}", file=sys.stderr, flush=True)
        results[name] = {
            v: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for v, rs in runs.items()
        }
    return results


Results = dict[str, dict[str, Any]]
Compute = Callable[[Results], tuple[str, bool]]


def _lower(figure: str, ours: str, base: str, key: str, target: float) -> Compute:
    return lambda r: _ratio(r[figure], ours, base, key, target, lower_is_better=True)


def _higher(figure: str, ours: str, base: str, key: str, target: float) -> Compute:
    return lambda r: _ratio(r[figure], ours, base, key, target)


def _at_most(figure: str, variant: str, key: str, limit: float) -> Compute:
    return lambda r: (f"{r[figure][variant][key]:,.1f}", r[figure][variant][key] <= limit)


# (target, figure it needs, how to compute (measured text, met)).
TARGETS: list[tuple[str, str, Compute]] = [
    ("idle p50, from INSERT sent, <= 1.3x the NOTIFY receipt floor", "idle_latency",
     _lower("idle_latency", ENQUEUER, FLOOR, "p50_insert_ms", 1.3)),
    ("idle p99, from INSERT sent, <= 2x the NOTIFY receipt floor", "idle_latency",
     _lower("idle_latency", ENQUEUER, FLOOR, "p99_insert_ms", 2.0)),
    ("idle p50, from INSERT sent, <= 0.6x the pipelined reference relay", "idle_latency",
     _lower("idle_latency", ENQUEUER, RELAY, "p50_insert_ms", 0.6)),
    (f"drain at {SMALL} B payloads >= 1.0x the spec SQL-only claim->delete", f"drain_{SMALL}",
     _higher(f"drain_{SMALL}", ENQUEUER, SQL_ONLY, "rows_per_s", 1.0)),
    (f"drain at {LARGE} B payloads >= 0.8x the spec SQL-only claim->delete", f"drain_{LARGE}",
     _higher(f"drain_{LARGE}", ENQUEUER, SQL_ONLY, "rows_per_s", 0.8)),
    ("worker on no-op handlers >= 0.5x a bare XREADGROUP + XACK/XDEL loop", "worker",
     _higher("worker", WORKER, BARE, "msgs_per_s", 0.5)),
    ("queue limits set, not binding: worker >= 0.9x without", "worker_limits",
     _higher("worker_limits", LIMITED, WORKER, "msgs_per_s", 0.9)),
    ("commit -> handled p50 <= 0.8x procrastinate's defer -> start", "handled_latency",
     _lower("handled_latency", "outbox-dispatcher", "procrastinate", "p50_ms", 0.8)),
    ("duplicates per 10,000 idle dispatches, one enqueuer: 0", "duplicates",
     _at_most("duplicates", "1 enqueuer", "per_10k", 0.0)),
    ("duplicates per 10,000 idle dispatches, two enqueuers: < 10", "duplicates",
     _at_most("duplicates", "2 enqueuers", "per_10k", 9.999)),
    ("insert tps at 16 clients, project trigger >= 0.9x no trigger", "insert_tps_16",
     lambda r: _ratio(r["insert_tps_16"], ib.PROJECT, "no trigger", "tps", 0.9,
                      also=("spec trigger", "no trigger"))),
]  # fmt: skip


def _ratio(
    figure: dict[str, Any],
    ours: str,
    base: str,
    key: str,
    target: float,
    *,
    lower_is_better: bool = False,
    also: tuple[str, str] | None = None,
) -> tuple[str, bool]:
    ratio = figure[ours][key] / figure[base][key]
    text = f"{ratio:.2f}x ({figure[ours][key]:,.2f} vs {figure[base][key]:,.2f})"
    if also:
        text += f"; {also[0]}: {figure[also[0]][key] / figure[also[1]][key]:.2f}x"
    return text, ratio <= target if lower_is_better else ratio >= target


def render_targets(results: Results) -> list[str]:
    lines = ["## Against the targets", "",
             "| target | measured | met |", "|---|---|---|"]  # fmt: skip
    for text, figure, compute in TARGETS:
        if figure not in results or not all(
            isinstance(v, dict) and v for v in results[figure].values()
        ):
            lines.append(f"| {text} | not measured in this run | - |")
            continue
        try:
            measured, met = compute(results)
        except (KeyError, ZeroDivisionError):
            lines.append(f"| {text} | not measured in this run | - |")
            continue
        lines.append(f"| {text} | {measured} | {'yes' if met else '**no**'} |")
    return [*lines, "", *idle_bound(results)]


def idle_bound(results: Results) -> list[str]:
    """What no relay gets below at idle, from this run: the floor plus one publish hop.

    A relay that publishes after its notification does at least that, with no
    work of its own: the NOTIFY receipt floor, then an XADD reaching a reader
    blocked on XREAD (``hops``, 20 ms apart, as the probe paces). The idle
    targets are judged against it here; empty when the run lacks either figure.
    """
    try:
        idle = results["idle_latency"]
        floor, relay = idle[FLOOR]["p50_insert_ms"], idle[RELAY]["p50_insert_ms"]
        hop = results["hops"]["20 ms apart"]["publish_to_reader_us"] / 1000
    except (KeyError, TypeError):
        return []
    bound = floor + hop
    return [
        f"Idle bound in this run: the NOTIFY receipt floor ({floor:.2f} ms from INSERT sent) "
        f"plus one XADD -> blocked XREAD reader hop ({hop:.3f} ms, `hops`) = {bound:.2f} ms, "
        f"{bound / floor:.2f}x the floor (target 1.3x) and {bound / relay:.2f}x the pipelined "
        "relay (target 0.6x): a relay that publishes after its notification, doing nothing "
        "else, is no faster.",
        "",
    ]


# The column a figure's "first/this" ratio is taken of: the first of these it has.
MAIN_KEYS = ("p50_insert_ms", "rows_per_s", "msgs_per_s", "tps", "p50_ms")
NOTES = Path(__file__).with_name("NOTES.md")


def render(results: Results, figs: Figures, *, rounds: int, load: tuple[str, str]) -> str:
    lines = ["# Benchmark results", ""]
    lines += [f"- {k}: {v}" for k, v in machine_facts().items()]
    lines += [f"- rounds: {rounds}, variants interleaved, medians "
              f"(duplicates: one round)",
              f"- load average (1/5/15 min) at the start: {load[0]}; at the end: {load[1]}",
              "- reproduce: `make bench` (`python -m benchmarks.run`); "
              "procrastinate's figure needs `.venv-bench` (see `handled_latency.py`)",
              ""]  # fmt: skip
    lines += render_targets(results)
    for name, variants in results.items():
        keys = list(next(iter(variants.values())))
        first = next(iter(variants.values()))
        main = next((k for k in MAIN_KEYS if k in keys), keys[-1])
        lines += [f"## {name}: {figs[name][0]}", "",
                  "| variant | " + " | ".join(keys) + f" | first/this ({main}) |",
                  "|---|" + "---|" * (len(keys) + 1)]  # fmt: skip
        for variant, found in variants.items():
            ratio = f"{first[main] / found[main]:.2f}x" if found.get(main) else ""
            cells = " | ".join(f"{found.get(k, float('nan')):,.2f}" for k in keys)
            lines.append(f"| {variant} | {cells} | {ratio} |")
        lines.append("")
    notes = [NOTES.read_text()] if NOTES.exists() else []
    return "\n".join(lines + notes + soak.summary())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], choices=sorted(FIGURES))
    parser.add_argument("--quick", action="store_true", help="every figure small, one round")
    parser.add_argument("--dispatches", type=int, help="idle dispatches of the duplicates figure")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    scale = QUICK if args.quick else Scale()
    if args.dispatches:
        scale = replace(scale, dispatches=args.dispatches)
    rounds = 1 if args.quick else args.rounds
    figs = figures(scale) | EARLIER | explain(scale)
    before = load_average()
    with bench_env() as env:
        results = asyncio.run(measure_all(env, figs, rounds, set(args.only)))
    text = render(results, figs, rounds=rounds, load=(before, load_average()))
    print(text)
    if not (args.only or args.quick or args.dispatches):
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
