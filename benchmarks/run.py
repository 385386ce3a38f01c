"""Run the benchmarks: ``python -m benchmarks.run [--rounds 3] [--only NAME]``.

Variants of one figure run interleaved (A, B, A, B, ...) so drift on the
machine hits them alike; each figure is the median of its rounds. Results go
to stdout and ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import enqueuer_bench
from benchmarks.env import BenchEnv, bench_env, machine_facts

Figure = Callable[[BenchEnv, str], Awaitable[dict[str, float]]]

FIGURES: dict[str, tuple[Figure, list[str]]] = {
    "idle_latency": (enqueuer_bench.idle_latency, ["pipelined", "per-row"]),
    "drain_50k": (enqueuer_bench.drain, ["pipelined", "per-row"]),
}


async def measure(env: BenchEnv, rounds: int, only: set[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, (figure, variants) in FIGURES.items():
        if only and name not in only:
            continue
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants:
                print(
                    f"[{name}] round {r + 1}/{rounds}: {variant} ...", file=sys.stderr, flush=True
                )
                runs[variant].append(await figure(env, variant))
        results[name] = {
            v: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for v, rs in runs.items()
        }
    return results


def render(results: dict[str, dict[str, Any]], rounds: int) -> str:
    facts = machine_facts()
    lines = ["# Benchmark results", ""]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    lines += [f"- rounds: {rounds} (medians), variants interleaved", "",
              "Reproduce: `make bench` (or `python -m benchmarks.run`).", ""]  # fmt: skip
    for name, variants in results.items():
        keys = list(next(iter(variants.values())))
        lines += [f"## {name}", "", "| variant | " + " | ".join(keys) + " |",
                  "|---|" + "---|" * len(keys)]  # fmt: skip
        for variant, figures in variants.items():
            lines.append(f"| {variant} | " + " | ".join(f"{figures[k]:.2f}" for k in keys) + " |")
        base = list(variants)
        if len(base) == 2:
            a, b = (variants[v] for v in base)
            ratios = ", ".join(f"{k} {a[k] / b[k]:.2f}x" for k in keys if b[k])
            lines += ["", f"{base[0]} / {base[1]}: {ratios}"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], choices=sorted(FIGURES))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    with bench_env() as env:
        results = asyncio.run(measure(env, args.rounds, set(args.only)))
    text = render(results, args.rounds)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
