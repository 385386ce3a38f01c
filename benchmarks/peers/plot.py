"""peers.png from peers.json: tasks/s, p50/p99 and CPU per task, per scenario and system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"outbox-dispatcher": "#1f77b4", "River": "#2ca02c", "procrastinate": "#ff7f0e",
          "Celery": "#9467bd"}  # fmt: skip


def plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = document["summary"]
    scenarios = list(summary)
    systems = list(dict.fromkeys(s for cells in summary.values() for s in cells))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    width = 0.8 / max(1, len(systems))
    panels = [
        ("tasks/s (higher is better)", "tasks_per_s", False, [s for s in scenarios if s != "idle"]),
        ("p50 (bar) and p99 (tick), ms, log", "p50_ms", True, scenarios),
        ("CPU ms per task (lower is better)", "cpu_ms_per_task", False, scenarios),
    ]
    for ax, (title, key, log, shown) in zip(axes, panels, strict=True):
        for i, system in enumerate(systems):
            xs = [n + (i - (len(systems) - 1) / 2) * width for n in range(len(shown))]
            values = [summary[s].get(system, {}).get(key, 0.0) for s in shown]
            color = COLORS.get(system, f"C{i + 4}")
            ax.bar(xs, values, width, label=system, color=color)
            if key == "p50_ms":
                p99 = [summary[s].get(system, {}).get("p99_ms", 0.0) for s in shown]
                ax.scatter(xs, p99, marker="_", s=200, color="black", zorder=3)
            for x, v in zip(xs, values, strict=True):
                ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(shown)), shown)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    facts = document["machine"]
    fig.suptitle(
        f"{facts['machine']}, PostgreSQL {facts['postgresql']}, Redis {facts['redis']}; "
        f"{document['settings']['tasks']:,} tasks, {document['settings']['rounds']} round(s), "
        "medians; load average in peers.json",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
