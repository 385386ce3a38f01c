"""The "nothing lost" checker: what was committed against what was handled.

Inputs: the load generator's log of every attempted task with its commit
outcome, the handler-run records on the recorder, dead letters (worker dead
stream and ``outbox_dlq``), and the final state of the outbox and of every
shard stream. After the pipeline quiesces:

- lost = committed - handled - dead-lettered            (must be empty)
- unexpected = handled (or dead-lettered) - committed   (must be empty)
- duplicates = handler runs beyond the first per task   (zero without worker/Redis faults)
- no outbox row left PENDING/RETRY/IN_FLIGHT, every shard stream of every queue (found by
  SCAN, not by the shard count) and PEL empty.

A commit whose outcome is unknown (the connection died inside COMMIT) counts
as committed exactly when its business row exists.
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis as sync_redis

from dispatcher.stream.naming import dead_letter_stream
from tests.faults.load import LoadGenerator

__all__ = ["RESULTS_JSONL", "Report", "Snapshot", "check", "record_result", "shard_streams"]

RESULTS_JSONL = Path(__file__).with_name("results.jsonl")
GROUP = "workers"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the checker reads, at one moment."""

    committed: frozenset[str]
    rolled_back: frozenset[str]
    unknown: int  # commits whose outcome the load generator could not know
    runs: collections.Counter[str]
    consumers: frozenset[str]
    dead: frozenset[str]
    outbox: dict[str, int]
    stream_entries: int
    pending_entries: int

    @property
    def lost(self) -> set[str]:
        return set(self.committed) - set(self.runs) - self.dead

    @property
    def unexpected(self) -> set[str]:
        return (set(self.runs) | self.dead) - self.committed

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.runs.values() if n > 1)

    @property
    def quiet(self) -> bool:
        """Drained: nothing left to publish, deliver or settle."""
        busy = sum(self.outbox.get(s, 0) for s in ("PENDING", "RETRY", "IN_FLIGHT"))
        return busy == 0 and self.stream_entries == 0 and self.pending_entries == 0


@dataclass(slots=True)
class Report:
    scenario: str
    tasks: int
    committed: int
    rolled_back: int
    unknown_commits: int
    handled: int
    dead_lettered: int
    lost: list[str]
    unexpected: list[str]
    duplicates: int
    leftover_rows: dict[str, int]
    stream_entries: int
    pending_entries: int
    consumers: int
    wall_seconds: float
    faults: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        doc = asdict(self)
        doc["lost"] = f"{len(self.lost)} {sorted(self.lost)[:10]}"
        doc["unexpected"] = f"{len(self.unexpected)} {sorted(self.unexpected)[:10]}"
        return json.dumps(doc, indent=1)


def shard_streams(redis: Any, queues: list[str]) -> list[str]:
    """Every existing shard stream of ``queues``, whatever the count (SCAN on every master)."""
    return sorted(
        str(key)
        for queue in queues
        for key in redis.scan_iter(match=f"workflow.tasks.{queue}.*", count=1000, _type="stream")
    )


def snapshot(
    *, load: LoadGenerator, db_url: str, redis: Any, recorder: sync_redis.Redis, key: str
) -> Snapshot:
    with psycopg.connect(db_url, connect_timeout=5) as conn:
        business = {r[0] for r in conn.execute("SELECT task_id FROM fault_business")}
        outbox = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status"))
        dlq_rows = {r[0] for r in conn.execute("SELECT task_id FROM outbox_dlq")}
    outcomes = dict(load.outcomes)
    committed = {t for t, o in outcomes.items() if o == "ok" or (o == "unknown" and t in business)}
    runs = [json.loads(r) for r in recorder.lrange(key, 0, -1)]  # type: ignore[union-attr]
    dead = {
        fields.get("task_id", "")
        for queue in load.queues
        for _id, fields in redis.xrange(dead_letter_stream(queue))
    }
    entries = pending = 0
    for stream in shard_streams(redis, load.queues):
        entries += int(redis.xlen(stream))
        if redis.exists(stream) and any(g["name"] == GROUP for g in redis.xinfo_groups(stream)):
            pending += int(redis.xpending(stream, GROUP)["pending"])
    return Snapshot(
        committed=frozenset(committed),
        rolled_back=frozenset(t for t, o in outcomes.items() if t not in committed),
        unknown=sum(1 for o in outcomes.values() if o == "unknown"),
        runs=collections.Counter(r["task"] for r in runs),
        consumers=frozenset(r["consumer"] for r in runs),
        dead=frozenset(dead | dlq_rows) - {""},
        outbox={str(k): int(v) for k, v in outbox.items()},
        stream_entries=entries,
        pending_entries=pending,
    )


def check(
    *,
    scenario: str,
    load: LoadGenerator,
    read: Callable[[], Snapshot],
    within: float,
    started: float,
    loss_expected: bool = False,
) -> Report:
    """Wait (up to ``within`` s) for the pipeline to drain everything committed; report.

    With ``loss_expected`` it stops at the first quiet snapshot: once no row, entry or
    pending delivery is left anywhere, a missing task can no longer turn up.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            snap = read()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        if (snap.quiet and (loss_expected or not snap.lost)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return Report(
        scenario=scenario,
        tasks=len(load.outcomes),
        committed=len(snap.committed),
        rolled_back=len(snap.rolled_back),
        unknown_commits=snap.unknown,
        handled=len(snap.runs),
        dead_lettered=len(snap.dead),
        lost=sorted(snap.lost),
        unexpected=sorted(snap.unexpected),
        duplicates=snap.duplicates,
        leftover_rows={s: n for s, n in snap.outbox.items() if s != "DLQ"},
        stream_entries=snap.stream_entries,
        pending_entries=snap.pending_entries,
        consumers=len(snap.consumers),
        wall_seconds=round(time.monotonic() - started, 1),
    )


def record_result(report: Report, *, long: bool) -> None:
    """In long mode, append the report to ``results.jsonl`` (RESULTS.md is rendered from it)."""
    if not long:
        return
    doc = asdict(report) | {"lost": len(report.lost), "unexpected": len(report.unexpected)}
    doc["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    doc["cores"] = os.cpu_count()
    with RESULTS_JSONL.open("a") as out:
        out.write(json.dumps(doc) + "\n")
