"""Business INSERT throughput with no trigger, the spec design's trigger, and ours.

The application side of the outbox: pgbench clients each commit one outbox
INSERT per transaction while a real ``dispatcher enqueuer`` process listens
and drains. The spec design's trigger NOTIFYs on every insert, which takes a
database-wide lock at commit; ours NOTIFYs only while an enqueuer holds the
idle flag (migration 0005), and runs no function at all otherwise.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from benchmarks.env import BenchEnv

SCRIPT = r"""\set r random(1, 1000000000)
INSERT INTO outbox (id, task_id, stream, payload, type)
VALUES (gen_random_uuid()::text, 'b' || :r, 'workflow.tasks.bench.' || (:r % 4),
        '{"task_id": "b", "input": "{}"}', 'TASK_EXECUTION');
"""

SPEC_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_spec_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END;
$$;
"""

SPEC_TRIGGER = (
    "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
    "FOR EACH STATEMENT EXECUTE FUNCTION bench_spec_notify_outbox()"
)
PROJECT = "project trigger"
TRIGGERS = ("no trigger", "spec trigger", PROJECT)

_installed: dict[str, str] = {}  # db_url -> the migrations' CREATE TRIGGER


def set_trigger(db_url: str, variant: str) -> None:
    """Install ``variant``'s trigger; "project trigger" is exactly what the migrations made."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        if db_url not in _installed:
            row = conn.execute(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'outbox_notify'"
            ).fetchone()
            assert row, "run the migrations first"
            _installed[db_url] = row[0]
        conn.execute(SPEC_FUNCTION)
        conn.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
        if variant == "spec trigger":
            conn.execute(SPEC_TRIGGER)
        elif variant == PROJECT:
            conn.execute(_installed[db_url])


@contextmanager
def enqueuer_process(env: BenchEnv) -> Iterator[None]:
    log = Path(tempfile.mkstemp(prefix="od-bench-enqueuer-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "enqueuer",
             "--database-url", env.db_url, "--redis-url", env.redis_url],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        log.unlink(missing_ok=True)


def pgbench_tps(db_url: str, clients: int, seconds: int = 8) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(SCRIPT)
        script.flush()
        out = subprocess.run(
            ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds),
             "-f", script.name, db_url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if not match:
        raise RuntimeError(f"unexpected pgbench output: {out.stdout[-500:]}")
    return float(match.group(1))


def insert_tps(env: BenchEnv, variant: str, clients: int) -> dict[str, float]:
    set_trigger(env.db_url, variant)
    try:
        with enqueuer_process(env):
            return {"tps": pgbench_tps(env.db_url, clients)}
    finally:
        set_trigger(env.db_url, PROJECT)
        with psycopg.connect(env.db_url, autocommit=True) as conn:
            conn.execute("TRUNCATE outbox")  # what the enqueuer left: not the next figure's
