"""What the benchmarks feed the system: realistic dispatches, pre-filled outboxes, processes.

A realistic dispatch is a ``TaskDispatch`` whose ``input`` looks like a resolved
task input (an order with a customer, an amount and line items); its stored
payload is ~433 bytes, as an application's would be, where a ``{"x": 1}`` input
gives ~150. ``payload_of_size`` pads the line items to reach a larger size
(4 KB), which PostgreSQL then stores compressed or out of line (TOAST).

The product runs as its own process, started from its command line with its
defaults (``dispatcher enqueuer``, ``dispatcher worker``), as in production;
``CpuMeter`` reads what each side spent from /proc, so a figure can say µs per
row in the product, in PostgreSQL and in Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg

from dispatcher.models import TaskDispatch

ROOT = Path(__file__).resolve().parents[1]
# Entered with the product's pids while a figure measures them (a profiler, say).
Around = Callable[[list[int]], AbstractContextManager[object]]
SMALL = 512  # "0.5 KB"
LARGE = 4096  # "4 KB"
TINY = 0  # the earlier harness's payload: one-letter ids and a '{"x": 1}' input


def _input(items: int, note: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {
        "order_id": "ord_9f2c41d7",
        "customer": {"id": "cus_51b7e0", "email": "ana@example.com"},
        "amount": {"value": 129.9, "currency": "EUR"},
        "items": [
            {"sku": f"SKU-{4410 + i:05d}", "qty": 1 + i % 3, "price": 21.65 + i}
            for i in range(items)
        ],
    }
    if note:
        body["note"] = note
    return body


def dispatch(task_id: str, queue: str, *, items: int = 1, note: str = "") -> TaskDispatch:
    """A realistic dispatch (with a uuid ``task_id`` and 1 line item: a 433-byte payload)."""
    return TaskDispatch(
        task_id=task_id,
        run_id="run_3c5e8a17",
        workflow_id="order-fulfilment",
        workflow_version=7,
        node_id="charge",
        node_type="http",
        queue=queue,
        attempt=1,
        input=json.dumps(_input(items, note)),
    )


def payload_size(d: TaskDispatch) -> int:
    return len(json.dumps(d.payload()))


def tiny_dispatch(task_id: str, queue: str) -> TaskDispatch:
    """The earlier harness's dispatch (a ~150-byte payload): to show what payload size costs."""
    return TaskDispatch(
        task_id=task_id, run_id="r", workflow_id="wf", workflow_version=1, node_id="n",
        node_type="t", queue=queue, attempt=1, input='{"x": 1}',
    )  # fmt: skip


def sized_dispatch(task_id: str, queue: str, size: int) -> TaskDispatch:
    """A realistic dispatch whose payload is ``size`` bytes (line items, then a note to fill);
    ``TINY``: the earlier harness's."""
    if size == TINY:
        return tiny_dispatch(task_id, queue)
    items = 1
    while payload_size(dispatch(task_id, queue, items=items + 1)) <= size - 20:
        items += 1
    pad = size - payload_size(dispatch(task_id, queue, items=items, note="-"))
    return dispatch(task_id, queue, items=items, note="-" * (1 + max(pad, 0)))


# Rows as enqueue_dispatch writes them, built in SQL from one payload so 50k rows take
# seconds: only the ids differ, and created_at, which rows committed one by one have each
# their own of (%(step)s apart; 0: all the same, as one INSERT of many rows gives: the
# created_at indexes then hold one key in a few posting lists, and claims walk them faster).
# Works on the project's table and on the spec's (same columns).
PREFILL = """
INSERT INTO outbox (id, task_id, stream, payload, type, created_at)
SELECT %(prefix)s || g, %(prefix)s || g, %(stream)s,
       jsonb_set(%(payload)s::jsonb, '{task_id}', to_jsonb(%(prefix)s || g)),
       'TASK_EXECUTION', now() - (%(n)s - g) * %(step)s * interval '1 microsecond'
  FROM generate_series(1, %(n)s) AS g
"""
STEP_US = 50  # a row per 50 µs: 20,000 rows/s committed one by one


def prefill(
    url: str,
    rows: int,
    *,
    queue: str,
    size: int,
    stream: str | None = None,
    fresh: bool = True,
    step_us: int = STEP_US,
) -> None:
    """A fresh outbox with ``rows`` due rows of ~``size``-byte payloads.

    TRUNCATE first: a drain leaves its rows as dead tuples (and index entries) that slow
    whichever variant runs next until vacuum gets to them. ``fresh=False`` shows that
    state: the table as a drain of ``rows`` rows just before left it. ``step_us``: see
    ``PREFILL``.
    """
    payload = json.dumps(sized_dispatch("t", queue, size).payload())
    params = {
        "stream": stream or f"workflow.tasks.{queue}", "payload": payload, "n": rows,
        "step": step_us,
    }  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox")
        if not fresh:
            conn.execute(PREFILL, params | {"prefix": f"{queue}-old-"})
            conn.execute("DELETE FROM outbox")
        conn.execute(PREFILL, params | {"prefix": f"{queue}-"})
        conn.execute("ANALYZE outbox")


def wait_empty(url: str) -> None:
    """Until the outbox has no rows (one connection; a new one per look costs a fork)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while (row := conn.execute("SELECT count(*) FROM outbox").fetchone()) and row[0]:
            time.sleep(0.005)


@contextlib.contextmanager
def processes(commands: Sequence[Sequence[str]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``commands`` (from the checkout root, output to a temporary log); SIGTERM after."""
    log = Path(tempfile.mkstemp(prefix="od-bench-proc-", suffix=".log")[1])
    with log.open("wb") as out:
        procs = [
            subprocess.Popen(list(c), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            for c in commands
        ]
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.unlink(missing_ok=True)


def enqueuer_command(db_url: str, redis_url: str, *extra: str) -> list[str]:
    """``dispatcher enqueuer`` with its defaults (LISTEN on), as production starts it."""
    return [sys.executable, "-m", "dispatcher.cli", "enqueuer",
            "--database-url", db_url, "--redis-url", redis_url, *extra]  # fmt: skip


def relay_command(db_url: str, redis_url: str, *extra: str) -> list[str]:
    """The pipelined reference relay (``benchmarks.baselines``) as its own process."""
    return [sys.executable, "-m", "benchmarks.baselines",
            "--database-url", db_url, "--redis-url", redis_url, *extra]  # fmt: skip


def cpu_seconds(names: set[str]) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of every process whose command is in ``names``."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if name in names:
            fields = text[text.rindex(")") + 2 :].split()
            found[int(stat.parent.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return found


def cpu_seconds_of(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def backends(db_url: str) -> set[int]:
    """PostgreSQL backends connected to ``db_url``'s database now (other databases' not)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(r[0]) for r in rows}


def _cpu_by_pid(pids: set[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            found[pid] = cpu_seconds_of([pid])
    return found


class CpuMeter:
    """CPU seconds spent since it was made, per side: the product's processes, the
    PostgreSQL backends of the benchmark's database, the benchmark's own redis-server.

    Only these processes count, so other work on a shared server is left out; so is
    PostgreSQL's shared background work (WAL writer, checkpointer), and a backend that
    connected and ended between two readings.
    """

    def __init__(self, db_url: str, *, product: set[int], redis_pid: int) -> None:
        self.db_url, self.product, self.redis_pid = db_url, product, redis_pid
        self.before = self._read()

    def _read(self) -> dict[str, dict[int, float]]:
        return {
            "product": _cpu_by_pid(self.product),
            "postgres": _cpu_by_pid(backends(self.db_url)),
            "redis": _cpu_by_pid({self.redis_pid} if self.redis_pid else set()),
        }

    def spent(self) -> dict[str, float]:
        after = self._read()
        return {
            side: sum(cpu - self.before[side].get(pid, 0.0) for pid, cpu in found.items())
            for side, found in after.items()
        }


def load_average() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())
