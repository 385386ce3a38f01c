"""The benchmark's target table: ratios, direction of "better", and figures not measured."""

from __future__ import annotations

from benchmarks.run import (
    BARE,
    ENQUEUER,
    FLOOR,
    RELAY,
    SQL_ONLY,
    WORKER,
    idle_bound,
    render_targets,
)
from benchmarks.workload import LARGE, SMALL


def row(lines: list[str], starts: str) -> str:
    (found,) = [line for line in lines if line.startswith(f"| {starts}")]
    return found


def test_targets_are_judged_in_the_right_direction() -> None:
    lines = render_targets(
        {
            f"drain_{SMALL}": {
                ENQUEUER: {"rows_per_s": 30.0},
                SQL_ONLY: {"rows_per_s": 45.0},
                RELAY: {"rows_per_s": 10.0},
            },
            f"drain_{LARGE}": {
                ENQUEUER: {"rows_per_s": 36.0},
                SQL_ONLY: {"rows_per_s": 45.0},
            },
            "idle_latency": {
                ENQUEUER: {"p50_insert_ms": 0.5, "p99_insert_ms": 3.0},
                FLOOR: {"p50_insert_ms": 0.4, "p99_insert_ms": 1.0},
                RELAY: {"p50_insert_ms": 1.0, "p99_insert_ms": 1.0},
            },
            "worker": {WORKER: {"msgs_per_s": 40.0}, BARE: {"msgs_per_s": 100.0}},
            "duplicates": {"1 enqueuer": {"per_10k": 0.0}, "2 enqueuers": {"per_10k": 10.0}},
        }
    )
    assert row(lines, f"drain at {SMALL} B").endswith("| 0.67x (30.00 vs 45.00) | **no** |")
    assert row(lines, f"drain at {LARGE} B").endswith("| 0.80x (36.00 vs 45.00) | yes |")
    assert row(lines, "idle p50, from INSERT sent, <= 1.3x").endswith(
        "| 1.25x (0.50 vs 0.40) | yes |"
    )
    assert row(lines, "idle p99").endswith("| 3.00x (3.00 vs 1.00) | **no** |")
    assert row(lines, "idle p50, from INSERT sent, <= 0.6x").endswith(
        "| 0.50x (0.50 vs 1.00) | yes |"
    )
    assert row(lines, "worker").endswith("| 0.40x (40.00 vs 100.00) | **no** |")
    assert row(lines, "duplicates per 10,000 idle dispatches, one").endswith("| 0.0 | yes |")
    assert row(lines, "duplicates per 10,000 idle dispatches, two").endswith("| 10.0 | **no** |")
    assert row(lines, "commit -> handled").endswith("| not measured in this run | - |")


def test_the_idle_bound_is_the_floor_plus_one_publish_hop() -> None:
    idle = {
        ENQUEUER: {"p50_insert_ms": 0.8},
        FLOOR: {"p50_insert_ms": 0.5},
        RELAY: {"p50_insert_ms": 1.0},
    }
    hops = {
        "back to back": {"publish_to_reader_us": 10.0},
        "20 ms apart": {"publish_to_reader_us": 100.0},
    }
    (line, _) = idle_bound({"idle_latency": idle, "hops": hops})
    assert "= 0.60 ms, 1.20x the floor" in line
    assert "0.60x the pipelined relay" in line
    assert idle_bound({"idle_latency": idle}) == []  # no hops figure: nothing claimed
