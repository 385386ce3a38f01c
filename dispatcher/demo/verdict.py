"""The demo's verdict and figures, computed from what it recorded. Pure functions."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Latency", "Verdict", "latency", "verdict"]


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p95_ms: float
    p99_ms: float


def latency(start: Mapping[str, float], end: Mapping[str, float]) -> Latency | None:
    """Percentiles of ``end[k] - start[k]`` over keys in both, in milliseconds."""
    samples = sorted((end[k] - start[k]) * 1000 for k in end.keys() & start.keys())
    if not samples:
        return None
    if len(samples) == 1:
        return Latency(samples[0], samples[0], samples[0])
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return Latency(p50_ms=cuts[49], p95_ms=cuts[94], p99_ms=cuts[98])


@dataclass(frozen=True, slots=True)
class Verdict:
    committed: int
    rolled_back: int
    handled: int
    duplicates: int
    missing: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected


def verdict(committed: set[str], rolled_back: set[str], handled_runs: Counter[str]) -> Verdict:
    """Every committed task handled, no rolled-back (or unknown) task handled."""
    handled = set(handled_runs)
    return Verdict(
        committed=len(committed),
        rolled_back=len(rolled_back),
        handled=len(handled),
        duplicates=sum(handled_runs.values()) - len(handled),
        missing=sorted(committed - handled),
        unexpected=sorted(handled - committed),
    )
