"""The load generator: business transactions that each enqueue a few tasks.

Each transaction inserts one ``fault_business`` row per task (the business
change) and the task's outbox row through ``enqueue_dispatch``, then commits
or, at random, rolls back. Every task attempted is logged with its outcome:

- ``ok``: COMMIT returned;
- ``rolled_back``: we rolled back, or a statement failed before COMMIT;
- ``unknown``: COMMIT itself failed (the connection died in it). The checker
  settles these afterwards: the business row exists iff the commit happened.

It runs in a thread at a bounded rate, reconnecting through server restarts.
With ``queues`` > 1 the tasks go round-robin to ``<queue>``, ``<queue>-1``...;
with ``not_before_every`` every n-th task is due ``not_before_delay`` s after
its commit.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from dispatcher import TaskDispatch, enqueue_dispatch

__all__ = ["BUSINESS_TABLE", "LoadGenerator", "LoadSpec"]

BUSINESS_TABLE = """
CREATE TABLE IF NOT EXISTS fault_business (
    task_id    TEXT PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    tasks: int
    rate: float  # tasks per second, across all writers
    writers: int = 2
    per_txn: tuple[int, int] = (1, 4)
    rollback: float = 0.0  # probability that a transaction rolls back
    poison_every: int = 0  # every n-th task is poison (0: none)
    task_input: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 25
    backoff_seconds: int = 1
    queues: int = 1
    not_before_every: int = 0
    not_before_delay: float = 3.0
    # Every n-th task passes the deprecated ``shards=`` as an application written for an
    # older release would (it must be ignored: the shard is picked when published).
    legacy_shards_every: int = 0
    legacy_shards: int = 8


class LoadGenerator:
    def __init__(self, *, db_url: str, queue: str, spec: LoadSpec) -> None:
        self.db_url = db_url
        self.queue = queue
        self.queues = [queue, *(f"{queue}-{n}" for n in range(1, spec.queues))]
        self.spec = spec
        self.outcomes: dict[str, str] = {}
        self.poison: set[str] = set()
        self.errors: list[str] = []
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._writer, args=(n,), daemon=True, name=f"load-{n}")
            for n in range(spec.writers)
        ]
        self.started = 0.0

    def start(self) -> LoadGenerator:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    @property
    def attempted(self) -> int:
        with self._lock:
            return len(self.outcomes)

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float = 600) -> LoadGenerator:
        for thread in self._threads:
            thread.join(timeout)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.wait(30)

    def _take(self, n: int) -> list[tuple[int, str]]:
        with self._lock:
            first = self._next
            n = min(n, self.spec.tasks - first)
            self._next += max(n, 0)
        return [(i, f"{self.queue}-{i}") for i in range(first, first + max(n, 0))]

    def _writer(self, number: int) -> None:
        rng = random.Random(number)
        interval = self.spec.writers / self.spec.rate
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            batch = self._take(rng.randint(*self.spec.per_txn))
            if not batch:
                break
            beat = time.monotonic()
            while True:
                try:
                    conn = conn if conn and not conn.closed else self._connect()
                    self._transaction(conn, batch, rollback=rng.random() < self.spec.rollback)
                    break
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0] if str(exc) else repr(exc))
                    if conn is not None:
                        conn.close()
                    conn = None
                    if all(self.outcomes.get(t) for _, t in batch):
                        break  # settled (rolled back or unknown); move on
                    if self._stop.wait(0.1):
                        return
            self._stop.wait(max(0.0, interval * len(batch) - (time.monotonic() - beat)))
        if conn is not None:
            conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.db_url, connect_timeout=3)

    def _transaction(
        self, conn: psycopg.Connection[Any], batch: list[tuple[int, str]], *, rollback: bool
    ) -> None:
        try:
            for index, task_id in batch:
                conn.execute("INSERT INTO fault_business (task_id) VALUES (%s)", (task_id,))
                every, legacy = self.spec.not_before_every, self.spec.legacy_shards_every
                delay = timedelta(seconds=self.spec.not_before_delay)
                enqueue_dispatch(
                    conn,
                    self._dispatch(index, task_id),
                    datetime.now(UTC) + delay if every and index % every == 1 else None,
                    max_retries=self.spec.max_retries,
                    backoff_seconds=self.spec.backoff_seconds,
                    **(
                        {"shards": self.spec.legacy_shards}
                        if legacy and index % legacy == 2
                        else {}
                    ),
                )
        except psycopg.Error:
            self._settle(batch, "rolled_back")  # nothing of it can commit now
            raise
        if rollback:
            conn.rollback()
            self._settle(batch, "rolled_back")
            return
        try:
            conn.commit()
        except psycopg.Error:
            self._settle(batch, "unknown")
            raise
        self._settle(batch, "ok")

    def _dispatch(self, index: int, task_id: str) -> TaskDispatch:
        task_input = dict(self.spec.task_input)
        if self.spec.poison_every and index % self.spec.poison_every == 0:
            task_input["poison"] = True
            with self._lock:
                self.poison.add(task_id)
        return TaskDispatch(
            task_id=task_id,
            run_id="run",
            workflow_id="wf",
            workflow_version=1,
            node_id=f"n{index}",
            node_type="fault",
            queue=self.queues[index % len(self.queues)],
            input=json.dumps(task_input),
        )

    def _settle(self, batch: list[tuple[int, str]], outcome: str) -> None:
        with self._lock:
            for _, task_id in batch:
                self.outcomes[task_id] = outcome
