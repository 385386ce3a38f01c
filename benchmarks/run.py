"""Run every benchmark figure in one run: ``python -m benchmarks.run [--rounds 3] [--only NAME]``.

Each figure has variants (the product and its baselines) that run interleaved
(A, B, C, A, B, C, ...) so drift on the machine hits them alike; each number
is the median of its rounds. Results go to stdout and ``benchmarks/RESULTS.md``.
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
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import enqueuer_bench as eb
from benchmarks import handled_latency as hl
from benchmarks import insert_bench as ib
from benchmarks import isolation_bench as xb
from benchmarks import soak
from benchmarks.env import BenchEnv, bench_env, machine_facts
from dispatcher.outbox import EnqueuerConfig

Variant = Callable[[BenchEnv], Any]
_DEFAULTS = EnqueuerConfig()

# figure -> (what it shows, {variant: measure}); the first variant is the product.
FIGURES: dict[str, tuple[str, dict[str, Variant]]] = {
    "insert_tps_4": (
        "business INSERT tps, 4 pgbench clients, enqueuer running",
        {v: partial(ib.insert_tps, variant=v, clients=4) for v in ib.TRIGGERS},
    ),
    "insert_tps_16": (
        "business INSERT tps, 16 pgbench clients, enqueuer running",
        {v: partial(ib.insert_tps, variant=v, clients=16) for v in ib.TRIGGERS},
    ),
    "idle_latency": (
        "commit -> entry in Redis at idle, one dispatch at a time (ms)",
        {
            "enqueuer": partial(eb.idle_latency, variant="pipelined"),
            "per-row relay": partial(eb.idle_latency, variant="per-row"),
            "bare NOTIFY round trip": eb.notify_round_trip,
        },
    ),
    "latency_1k": (
        "commit -> entry in Redis at ~1,000 rows/s offered (ms, 1 ms resolution)",
        {"enqueuer": partial(eb.latency_under_load, variant="pipelined")},
    ),
    "drain_50k": (
        f"drain of 50,000 pre-filled rows, default settings (batch {_DEFAULTS.batch_size}, "
        f"concurrency {_DEFAULTS.concurrency}; the spec baselines use the same)",
        {
            "enqueuer": partial(eb.drain, variant="pipelined"),
            "spec relay (spec SQL, per-row XADD)": eb.spec_relay,
            "spec SQL-only claim->delete, spec table": partial(eb.sql_only_cycle, schema="spec"),
            "spec SQL-only claim->delete, our table": partial(eb.sql_only_cycle, schema="ours"),
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
    "handled_latency": hl.figure(),  # procrastinate baseline: needs .venv-bench (see module)
}


async def _call(measure: Variant, env: BenchEnv) -> dict[str, float]:
    result = measure(env)
    if inspect.isawaitable(result):
        result = await result
    return dict(result)


async def measure_all(env: BenchEnv, rounds: int, only: set[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, (_, variants) in FIGURES.items():
        if only and name not in only:
            continue
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant, measure in variants.items():
                print(f"[{name}] round {r + 1}/{rounds}: {variant}", file=sys.stderr, flush=True)
                runs[variant].append(await _call(measure, env))
        results[name] = {
            v: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for v, rs in runs.items()
        }
    return results


Results = dict[str, dict[str, Any]]
SPEC_SQL = "spec SQL-only claim->delete, spec table"
SPEC_RELAY = "spec relay (spec SQL, per-row XADD)"

# (target of issue 9 or 3, figure it needs, how to compute (measured text, met)).
TARGETS: list[tuple[str, str, Callable[[Results], tuple[str, bool]]]] = [
    ("insert tps at 16 clients, project trigger >= 0.9x no trigger", "insert_tps_16",
     lambda r: _ratio(r["insert_tps_16"], "project trigger", "no trigger", "tps", 0.9,
                      also=("spec trigger", "no trigger"))),
    ("insert tps at 4 clients, project trigger >= 0.9x no trigger", "insert_tps_4",
     lambda r: _ratio(r["insert_tps_4"], "project trigger", "no trigger", "tps", 0.9,
                      also=("spec trigger", "no trigger"))),
    ("idle commit -> stream p50 <= 5 ms (issue 3)", "idle_latency",
     lambda r: _bound(r["idle_latency"]["enqueuer"]["p50_ms"], 5.0, "ms")),
    ("idle p50 <= 1.3x the bare NOTIFY round trip", "idle_latency",
     lambda r: _ratio(r["idle_latency"], "enqueuer", "bare NOTIFY round trip", "p50_ms", 1.3,
                      lower_is_better=True)),
    ("idle p99 <= 2x the bare NOTIFY round trip", "idle_latency",
     lambda r: _ratio(r["idle_latency"], "enqueuer", "bare NOTIFY round trip", "p99_ms", 2.0,
                      lower_is_better=True)),
    ("p99 at ~1,000 rows/s <= 10 ms", "latency_1k",
     lambda r: _bound(r["latency_1k"]["enqueuer"]["p99_ms"], 10.0, "ms")),
    ("drain >= 1.0x the spec SQL-only cycle (spec table)", "drain_50k",
     lambda r: _ratio(r["drain_50k"], "enqueuer", SPEC_SQL, "rows_per_s", 1.0)),
    ("drain >= 3x the per-row relay (issues 3 and 9)", "drain_50k",
     lambda r: _ratio(r["drain_50k"], "enqueuer", SPEC_RELAY, "rows_per_s", 3.0)),
    ("two enqueuers drain >= 1.5x one", "drain_processes",
     lambda r: _ratio(r["drain_processes"], "2 enqueuers", "1 enqueuer", "rows_per_s", 1.5)),
    ("p99 at ~50 rows/s, transaction opened while draining <= 50 ms", "flag_blocked",
     lambda r: _bound(r["flag_blocked"]["50/s, opened while draining"]["p99_ms"], 50.0, "ms")),
    ("p99 at ~50 rows/s, transaction open at start <= 50 ms", "flag_blocked",
     lambda r: _bound(r["flag_blocked"]["50/s, open at start"]["p99_ms"], 50.0, "ms")),
    ("sparse p50, transaction opened while draining <= 50 ms", "flag_blocked",
     lambda r: _bound(r["flag_blocked"]["sparse, opened while draining"]["p50_ms"], 50.0, "ms")),
    ("sparse p50, transaction open at start <= 50 ms", "flag_blocked",
     lambda r: _bound(r["flag_blocked"]["sparse, open at start"]["p50_ms"], 50.0, "ms")),
    ("idle p50 with 200k not-yet-due rows <= 1.2x none", "not_yet_due",
     lambda r: _ratio(r["not_yet_due"], "200k not yet due", "none waiting", "p50_ms", 1.2,
                      lower_is_better=True)),
    ("commit -> handled p50 <= 0.6x procrastinate", "handled_latency",
     lambda r: _ratio(r["handled_latency"], "outbox-dispatcher", "procrastinate", "p50_ms", 0.6,
                      lower_is_better=True)),
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


def _bound(value: float, limit: float, unit: str) -> tuple[str, bool]:
    return f"{value:,.2f} {unit}", value <= limit


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
    lines += ["| worker consume >= 0.7x a bare XREADGROUP + XACK/XDEL loop "
              "| see `results/worker_consume.md` (its own harness) | - |", ""]  # fmt: skip
    return lines


def render(results: dict[str, dict[str, Any]], rounds: int) -> str:
    lines = ["# Benchmark results", ""]
    lines += [f"- {k}: {v}" for k, v in machine_facts().items()]
    lines += [f"- rounds: {rounds}, variants interleaved, medians",
              "- reproduce: `make bench` (`python -m benchmarks.run`)", ""]  # fmt: skip
    for name, variants in results.items():
        keys = list(next(iter(variants.values())))
        first = next(iter(variants.values()))
        lines += [f"## {name}: {FIGURES[name][0]}", "",
                  "| variant | " + " | ".join(keys) + " | ratio to first |",
                  "|---|" + "---|" * (len(keys) + 1)]  # fmt: skip
        for variant, figures in variants.items():
            ratio = ", ".join(f"{first[k] / figures[k]:.2f}x" for k in keys[-1:] if figures[k])
            cells = " | ".join(f"{figures[k]:,.2f}" for k in keys)
            lines.append(f"| {variant} | {cells} | first/this: {ratio} |")
        lines.append("")
    return "\n".join(lines + soak.summary() + render_targets(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], choices=sorted(FIGURES))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    with bench_env() as env:
        results = asyncio.run(measure_all(env, args.rounds, set(args.only)))
    text = render(results, args.rounds)
    print(text)
    if not args.only:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
