"""Soak: the outbox under a steady rate with bursts for tens of minutes, sampled over time.

``python -m benchmarks.soak [--minutes 30] [--rate 200] [--burst-rows 20000]
[--burst-every 300] [--sample-every 30]`` (``make soak``).

Every dispatch is an INSERT and a DELETE, so a queue table collects dead
tuples as fast as it moves rows; if vacuum falls behind, the table and its
indexes grow, the claim reads more dead entries and latency creeps up. This
runs two variants side by side, each with its own database, Redis and
``dispatcher enqueuer`` process, under the same load:

- ``enqueuer``: as shipped: autovacuum as the migrations tune it (after a fixed
  number of dead tuples, unthrottled), and the enqueuer's own maintenance
  vacuum when nothing else has vacuumed the outbox for a minute;
- ``autovacuum only``: ``--vacuum-threshold 0``, the outbox left to the
  server's autovacuum alone (the header says whether it is on).

Each sample records the table and index sizes, dead tuples, autovacuum runs,
the claim query's execution time (EXPLAIN ANALYZE in a rolled-back
transaction) and commit->stream p50/p99 over the window. A reader trims what
it has read, so Redis stays small. Results: ``benchmarks/results/soak.md``
and a summary section in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis as sync_redis

from benchmarks.env import ADMIN_URL, BenchEnv, bench_env, machine_facts
from dispatcher.outbox.queries import QUERIES
from dispatcher.stream.naming import queue_streams

HERE = Path(__file__).parent
SHARDS = 4
VARIANTS: dict[str, tuple[str, ...]] = {
    "enqueuer": (),
    "autovacuum only": ("--vacuum-threshold", "0"),
}
PAYLOAD = json.dumps({"input": "x" * 400})  # ~0.5 KB rows


@dataclass(frozen=True, slots=True)
class Load:
    rate: float
    burst_rows: int
    burst_every: float


@dataclass(slots=True)
class Sample:
    minute: float
    committed: int
    delivered: int
    table_kb: int
    index_kb: int
    dead_tuples: int
    autovacuums: int
    claim_ms: float
    p50_ms: float | None
    p99_ms: float | None
    load1: float  # the machine's 1-minute load average: other work skews latency


@dataclass(slots=True)
class Variant:
    name: str
    env: BenchEnv
    queue: str = field(default_factory=lambda: f"soak{uuid.uuid4().hex[:6]}")
    committed_at: dict[str, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # this window's, in ms
    delivered: int = 0
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _writer(v: Variant, load: Load, stop: threading.Event) -> None:
    """One row per transaction at ``load.rate``, plus a burst every ``load.burst_every`` s."""
    stream = f"workflow.tasks.{v.queue}"
    with psycopg.connect(v.env.db_url, autocommit=True) as conn:
        started = time.monotonic()
        next_burst = started + load.burst_every
        n = 0
        while not stop.is_set():
            now = time.monotonic()
            if load.burst_rows and now >= next_burst:
                _burst(conn, v, stream, load.burst_rows)
                next_burst += load.burst_every
            n += 1
            row_id = f"{v.queue}-s{n}"
            conn.execute(
                "INSERT INTO outbox (id, task_id, stream, payload) VALUES (%s, %s, %s, %s)",
                (row_id, row_id, stream, PAYLOAD),
            )
            with v.lock:
                v.committed_at[row_id] = time.monotonic()
            stop.wait(max(0.0, started + n / load.rate - time.monotonic()))


def _burst(conn: psycopg.Connection[Any], v: Variant, stream: str, rows: int) -> None:
    prefix = f"{v.queue}-b{uuid.uuid4().hex[:6]}-"
    conn.execute(
        "INSERT INTO outbox (id, task_id, stream, payload)"
        " SELECT %(p)s || g, %(p)s || g, %(s)s, %(payload)s::jsonb"
        "   FROM generate_series(1, %(n)s) AS g",
        {"p": prefix, "s": stream, "payload": PAYLOAD, "n": rows},
    )
    acked = time.monotonic()
    with v.lock:
        v.committed_at.update({f"{prefix}{i}": acked for i in range(1, rows + 1)})


def _reader(v: Variant, stop: threading.Event) -> None:
    """Read every entry as it arrives; time it against its commit; trim what was read."""
    client = sync_redis.Redis.from_url(v.env.redis_url, decode_responses=True)
    # The rows name the queue's unsharded stream; the enqueuer may publish there or to a shard.
    names = [f"workflow.tasks.{v.queue}", *queue_streams([v.queue], SHARDS)]
    last = dict.fromkeys(names, "0-0")
    while not stop.is_set():
        reply = client.xread(last, count=1000, block=200) or []  # type: ignore[arg-type]
        seen = time.monotonic()
        for stream, entries in reply:
            for entry_id, fields in entries:
                last[stream] = entry_id
                with v.lock:
                    committed = v.committed_at.pop(fields.get("outbox_id", ""), None)
                    v.delivered += 1
                    if committed is not None:
                        v.latencies.append((seen - committed) * 1000)
            client.xtrim(stream, minid=last[stream])
    client.close()


def _sample(v: Variant, minute: float, committed: int) -> Sample:
    with psycopg.connect(v.env.db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_relation_size('outbox') / 1024, pg_indexes_size('outbox') / 1024,"
            "       n_dead_tup, autovacuum_count"
            "  FROM pg_stat_user_tables WHERE relname = 'outbox'"
        ).fetchone()
        assert row is not None
        conn.execute("BEGIN")
        conn.execute(QUERIES["prepare_claim_batch"])
        plan = conn.execute(  # as the enqueuer claims
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE outbox_claim_batch (100)"
        ).fetchone()
        conn.execute("ROLLBACK")
    claim_ms = float(plan[0][0]["Execution Time"]) if plan else float("nan")
    with v.lock:
        window, v.latencies = sorted(v.latencies), []
        delivered = v.delivered
    return Sample(
        minute=round(minute, 1),
        committed=committed,
        delivered=delivered,
        table_kb=int(row[0]),
        index_kb=int(row[1]),
        dead_tuples=int(row[2]),
        autovacuums=int(row[3]),
        claim_ms=round(claim_ms, 3),
        p50_ms=round(statistics.median(window), 2) if window else None,
        p99_ms=round(window[int(len(window) * 0.99)], 2) if window else None,
        load1=round(os.getloadavg()[0], 2),
    )


@contextlib.contextmanager
def _enqueuer(v: Variant, log_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (log_dir / f"enqueuer-{v.queue}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "enqueuer",
         "--database-url", v.env.db_url, "--redis-url", v.env.redis_url, *VARIANTS[v.name]],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def run(
    *, minutes: float, load: Load, sample_every: float, variants: tuple[str, ...] = tuple(VARIANTS)
) -> dict[str, list[Sample]]:
    """Soak every variant at once for ``minutes``; return their samples."""
    with contextlib.ExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="od-soak-")))
        runs = []
        for name in variants:
            v = Variant(name=name, env=stack.enter_context(bench_env()))
            stack.enter_context(_enqueuer(v, log_dir))
            runs.append(v)
        stop = threading.Event()
        threads = [
            threading.Thread(target=target, args=args, daemon=True)
            for v in runs
            for target, args in ((_writer, (v, load, stop)), (_reader, (v, stop)))
        ]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        try:
            while (elapsed := time.monotonic() - started) < minutes * 60:
                time.sleep(min(sample_every, max(0.0, minutes * 60 - elapsed)))
                minute = (time.monotonic() - started) / 60
                for v in runs:
                    committed = _committed(v)
                    v.samples.append(_sample(v, minute, committed))
                    print(f"[{minute:5.1f} min] {v.name}: {_row(v.samples[-1])}", flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        return {v.name: v.samples for v in runs}


def _committed(v: Variant) -> int:
    with psycopg.connect(v.env.db_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    with v.lock:
        return v.delivered + (int(row[0]) if row else 0)


_COLUMNS = (
    "| min | committed | delivered | table KB | index KB | dead tuples | autovacuums "
    "| claim ms | commit->stream p50 ms | p99 ms | load avg |"
)


def _row(s: Sample) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return (
        f"| {s.minute} | {s.committed} | {s.delivered} | {s.table_kb} | {s.index_kb} "
        f"| {s.dead_tuples} | {s.autovacuums} | {s.claim_ms:.3f} | {ms(s.p50_ms)} "
        f"| {ms(s.p99_ms)} | {s.load1} |"
    )


def flatness(samples: list[Sample]) -> dict[str, float]:
    """Last third over first third (medians) of what must stay flat; 1.0 = flat."""
    third = max(len(samples) // 3, 1)
    first, last = samples[:third], samples[-third:]

    def ratio(attr: str) -> float:
        values = [getattr(s, attr) for s in first], [getattr(s, attr) for s in last]
        a, b = (statistics.median([x for x in vs if x is not None] or [0]) for vs in values)
        return round(b / a, 2) if a else float("nan")

    return {a: ratio(a) for a in ("table_kb", "index_kb", "claim_ms", "p99_ms")}


def render(results: dict[str, list[Sample]], *, command: str, load: Load) -> str:
    facts = machine_facts()
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    autovacuum = row[0] if row else "?"
    loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = [
        "# Soak: the outbox over time",
        "",
        f"`{command}`: {load.rate:g} rows/s steady (one per transaction) plus a burst of "
        f"{load.burst_rows:,} rows every {load.burst_every:g} s; both variants at once, each with "
        "its own database, Redis and enqueuer.",
        "",
        f"Machine: {facts['machine']}; PostgreSQL {facts['postgresql']}; Redis {facts['redis']};"
        f" {facts['date']}; server autovacuum = {autovacuum}; load average at the end"
        f" {loadavg}.",
        "",
    ]
    for name, samples in results.items():
        flat = flatness(samples)
        out += [
            f"## {name}",
            "",
            "Last third over first third (medians; 1.0 = flat): "
            + ", ".join(f"{k} {v}" for k, v in flat.items()),
            "",
            f"At the end: table {samples[-1].table_kb:,} KB, indexes {samples[-1].index_kb:,} KB,"
            f" {samples[-1].dead_tuples:,} dead tuples, claim {samples[-1].claim_ms:.3f} ms;"
            f" largest table {max(x.table_kb for x in samples):,} KB.",
            "",
            _COLUMNS,
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *(_row(s) for s in samples),
            "",
        ]
    return "\n".join(out)


def summary(path: Path = HERE / "results" / "soak.md") -> list[str]:
    """The soak's section of ``RESULTS.md``: its command, machine and flatness per variant."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    keep = [line for line in lines if line.startswith(("`python -m", "Machine:", "## "))]
    flat = [line for line in lines if line.startswith(("Last third", "At the end"))]
    out = ["## Soak (`make soak`; every sample in `results/soak.md`)", ""]
    out += [keep[0], "", keep[1], ""] if len(keep) > 1 else []
    variants = [line.removeprefix("## ") for line in keep if line.startswith("## ")]
    pairs = [" ".join(flat[i : i + 2]) for i in range(0, len(flat), 2)]
    out += [f"- **{name}**: {text}" for name, text in zip(variants, pairs, strict=False)]
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200.0, help="steady rows per second")
    parser.add_argument("--burst-rows", type=int, default=20_000)
    parser.add_argument("--burst-every", type=float, default=300.0, help="seconds")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "soak.md")
    args = parser.parse_args(argv)
    load = Load(rate=args.rate, burst_rows=args.burst_rows, burst_every=args.burst_every)
    results = run(minutes=args.minutes, load=load, sample_every=args.sample_every)
    command = "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(results, command=command.strip(), load=load)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
