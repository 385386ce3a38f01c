"""The benchmark's target table: ratios, direction of "better", and figures not measured."""

from __future__ import annotations

from benchmarks.run import SPEC_RELAY, SPEC_SQL, render_targets


def row(lines: list[str], starts: str) -> str:
    (found,) = [line for line in lines if line.startswith(f"| {starts}")]
    return found


def test_targets_are_judged_in_the_right_direction() -> None:
    lines = render_targets(
        {
            "drain_50k": {
                "enqueuer": {"rows_per_s": 30.0},
                SPEC_RELAY: {"rows_per_s": 10.0},
                SPEC_SQL: {"rows_per_s": 45.0},
            },
            "idle_latency": {
                "enqueuer": {"p50_ms": 0.5, "p99_ms": 3.0},
                "bare NOTIFY round trip": {"p50_ms": 0.4, "p99_ms": 1.0},
            },
        }
    )
    assert row(lines, "drain >= 3x").endswith("| 3.00x (30.00 vs 10.00) | yes |")
    assert row(lines, "drain >= 1.0x").endswith("| **no** |")
    assert row(lines, "idle p50 <= 1.3x").endswith("| 1.25x (0.50 vs 0.40) | yes |")
    assert row(lines, "idle p99 <= 2x").endswith("| 3.00x (3.00 vs 1.00) | **no** |")
    assert row(lines, "idle commit -> stream p50 <= 5 ms").endswith("| 0.50 ms | yes |")
    assert row(lines, "two enqueuers").endswith("| not measured in this run | - |")
