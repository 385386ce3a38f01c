"""Where an idle dispatch's time goes, step by step: ``python -m benchmarks.idle_steps``.

The idle probe (``probe.py``: one realistic dispatch committed 20 ms after the
previous became visible, a reader blocked on XREAD, a plain LISTEN session for
the NOTIFY receipt floor) against ``dispatcher enqueuer`` processes started
through this module (``--serve``), which wraps a few of the product's functions
to stamp ``time.perf_counter_ns()`` (one clock for every process on the
machine) at each step of the idle path: the notification handed to the
enqueuer, the batch task starting, each SQL statement sent and answered, the
XADD written and answered, the settlement done. Nothing of this is in the
shipped code: the wrappers exist only in the ``--serve`` process.

Each code tree named by ``--tree NAME=PATH`` (``PYTHONPATH`` of its enqueuer
process; ``.`` is this checkout) runs ``--samples`` dispatches per round,
trees alternating round by round, so machine drift hits them alike. Printed:
per tree, the median time of each step from the INSERT sent, and the load
average at the start and the end.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import inspect
import json
import math
import os
import queue as queues
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

_EVENTS: list[tuple[str, int]] = []


def _stamp(name: str) -> None:
    _EVENTS.append((name, time.perf_counter_ns()))


def _wrap(owner: Any, attr: str, before: str | None, after: str | None = None) -> None:
    """Stamp ``before``/``after`` around ``owner.attr`` (sync or async); missing: skipped."""
    original = getattr(owner, attr, None)
    if original is None:
        return
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                _stamp(before)
            try:
                return await original(*args, **kwargs)
            finally:
                if after:
                    _stamp(after)
    else:

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                _stamp(before)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    _stamp(after)

    setattr(owner, attr, wrapped)


def _wrap_sql(cursor_class: Any) -> None:
    """Stamp each statement sent and answered, by its first word (BEGIN, INSERT, DELETE...)."""
    original = cursor_class.execute

    @functools.wraps(original)
    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(getattr(query, "_obj", query))
        word = (text.split() or ["?"])[0].upper()
        _stamp(f"sql {word} sent")
        try:
            return await original(self, query, *args, **kwargs)
        finally:
            _stamp(f"sql {word} back")

    cursor_class.execute = execute


def _instrument() -> None:
    from dispatcher.outbox import enqueuer, listener, pipeline, repository
    from dispatcher.stream import publisher

    _wrap(listener.NotificationHints, "receive", "notified")
    _wrap(enqueuer.OutboxEnqueuer, "wake", "wake")
    _wrap(enqueuer.OutboxEnqueuer, "_batch_in_slot", "slot task runs")
    _wrap(pipeline.BatchPipeline, "run", "pipeline.run")
    _wrap(pipeline, "encode_batch", "encode")
    _wrap(publisher.RedisStreamPublisher, "publish_packed", "publish_packed", "XADD back")
    _wrap(publisher, "execute_packed", "XADD sent")
    _wrap(enqueuer.OutboxEnqueuer, "_kicked", None, "main loop woken")
    with contextlib.suppress(ImportError):  # the loop's signals and slots of their own
        from dispatcher.outbox import batch_slots, loop_signals

        _wrap(loop_signals.LoopSignals, "ring", "wake")
        _wrap(loop_signals.LoopSignals, "wait", None, "main loop woken")
        _wrap(batch_slots.BatchSlots, "batch_in_slot", "slot task runs")
    _wrap_sql(psycopg.AsyncCursor)
    from dispatcher.outbox import claim

    _wrap(claim.ClaimedBatch, "settle", None, "settled")
    if hasattr(claim, "BatchClaims"):  # the claim in one module
        _wrap(claim.BatchClaims, "_claimed", "rows in hand")
        _wrap(claim.BatchClaims, "_journal", "journal task runs")
        _wrap(claim.BatchClaims, "_begin", "ClaimStatement.begin")
    else:  # a baseline tree from before it: the repository ran the claim
        from dispatcher.outbox import claim_statement  # type: ignore[attr-defined]

        _wrap(repository.OutboxRepository, "_claimed", "rows in hand")
        _wrap(repository.OutboxRepository, "_open_journal", "journal task runs")
        _wrap(claim_statement.ClaimStatement, "begin", "ClaimStatement.begin")


def serve(out: str, argv: list[str]) -> int:
    """Run ``dispatcher enqueuer`` (``argv``) instrumented; write the stamps to ``out`` at exit."""
    # The tree under test first: ``-m`` put the working directory (this checkout) first.
    sys.path.insert(0, os.environ["OD_TREE"])
    _instrument()

    def dump() -> None:
        Path(out).write_text(json.dumps(_EVENTS))

    atexit.register(dump)
    from dispatcher.cli.main import main as cli

    return cli(["enqueuer", *argv])


# --- the probe side ---------------------------------------------------------------------


def _samples(env: Any, tree: str, samples: int) -> tuple[list[dict[str, float]], list[Any]]:
    """One round: ``samples`` dispatches through an instrumented enqueuer of ``tree``."""
    from benchmarks import probe
    from benchmarks.workload import processes

    queue = probe._fresh_queue(env)
    out = tempfile.mktemp(prefix="od-idle-steps-", suffix=".json")
    command = [sys.executable, "-m", "benchmarks.idle_steps", "--serve", out, "--",
               "--database-url", env.db_url, "--redis-url", env.redis_url]  # fmt: skip
    here = str(Path(__file__).resolve().parent.parent)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([tree, here])
    os.environ["OD_TREE"] = tree
    times: list[dict[str, float]] = []
    try:
        with (
            processes([command]),
            probe.receivers(env, queue) as r,
            psycopg.connect(env.db_url) as conn,
        ):
            r.seen(probe._send(conn, queue)[0], 60.0)
            for i in range(probe.WARMUP + samples):
                time.sleep(probe.GAP)
                while not r.notified.empty():
                    r.notified.get_nowait()
                outbox_id, sent, acked = probe._send(conn, queue)
                visible = r.seen(outbox_id, probe.TIMEOUT)
                try:
                    notified = r.notified.get(timeout=probe.NOTIFY_LAG)
                except queues.Empty:  # no enqueuer was idle: the trigger sent none
                    notified = float("nan")
                if i >= probe.WARMUP:
                    times.append(
                        {"sent": sent, "acked": acked, "floor": notified, "visible": visible}
                    )
    finally:
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    events = json.loads(Path(out).read_text())
    Path(out).unlink()
    return times, events


def _steps(times: list[dict[str, float]], events: list[Any]) -> dict[str, list[float]]:
    """Each step's first stamp inside each sample's window, in ms from the INSERT sent."""
    events.sort(key=lambda e: e[1])
    found: dict[str, list[float]] = defaultdict(list)
    stamps = [(name, ns / 1e9) for name, ns in events]
    for t in times:
        sent = t["sent"]
        end = t["visible"] + 0.005
        seen: dict[str, int] = {}
        for name, at in stamps:
            if at < sent or at > end:
                continue
            seen[name] = seen.get(name, 0) + 1
            label = name if seen[name] == 1 else f"{name} #{seen[name]}"
            found[label].append((at - sent) * 1000)
        for key in ("acked", "floor", "visible"):
            if not math.isnan(t[key]):
                found[f"probe: {key}"].append((t[key] - sent) * 1000)
        if not math.isnan(t["floor"]):  # what the relay adds to the floor, sample by sample
            found["after the floor"].append((t["visible"] - t["floor"]) * 1000)
    return found


def _summary(found: dict[str, list[float]]) -> str:
    floor, seen, after = (
        statistics.median(found[k]) for k in ("probe: floor", "probe: visible", "after the floor")
    )
    return (
        f"p50 visible {seen:.3f} ms, floor {floor:.3f} ms ({seen / floor:.2f}x),"
        f" p50 after the floor {after:.3f} ms"
    )


def run(trees: dict[str, str], rounds: int, samples: int) -> None:
    from benchmarks.env import bench_env, machine_facts

    print(machine_facts(), "load at start", os.getloadavg())
    steps: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in trees}
    with bench_env() as env:
        for _ in range(rounds):
            for name, path in trees.items():
                found = _steps(*_samples(env, path, samples))
                print(f"  round {name}: {_summary(found)}, load {os.getloadavg()[0]:.2f}")
                for key, values in found.items():
                    steps[name][key].extend(values)
    print("load at end", os.getloadavg())
    for name, found in steps.items():
        total = len(found["probe: visible"])
        print(f"\n== {name}: {total} dispatches; {_summary(found)}")
        print("median ms from INSERT sent (count)")
        for key, values in sorted(found.items(), key=lambda kv: statistics.median(kv[1])):
            if len(values) >= total // 2 and key != "after the floor":
                print(f"  {statistics.median(values):7.3f}  {key} ({len(values)})")


@contextlib.contextmanager
def _own_postgres() -> Iterator[None]:
    """A throwaway PostgreSQL with durable commits (as a production server), if none is set."""
    if os.environ.get("BENCH_DATABASE_URL"):
        yield
        return
    from dispatcher.demo.throwaway import PostgresProcess

    workdir = Path(tempfile.mkdtemp(prefix="od-idle-steps-pg-"))
    durable = ("fsync = on", "synchronous_commit = on", "full_page_writes = on")
    pg = PostgresProcess(workdir, *durable).start()
    os.environ["BENCH_DATABASE_URL"] = pg.url()
    try:
        yield
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return serve(argv[1], argv[3:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": "."}
    trees = {k: str(Path(v).resolve()) for k, v in trees.items()}
    with _own_postgres():
        run(trees, args.rounds, args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
