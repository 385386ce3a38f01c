"""A row that kills every enqueuer that takes it: found alone, dead-lettered; its batch-mates go.

The enqueuer is a real process that ``os._exit``s whenever it encodes the marked
row, restarted each time it dies (as a Deployment would). Recovery must not take
a crashed batch as a verdict on all its rows: the healthy ones are published,
uncharged, and the marked one reaches ``outbox_dlq`` after its retries.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import redis as sync_redis

from dispatcher.stream import queue_streams
from tests.fix_db import charged
from tests.outbox_rows import INSERT_ONE, dead_letters, flat_payload

RETRIES = 2


def due_rows(db_url: str) -> int:
    """Rows still to be published or dead-lettered."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox WHERE status IN ('PENDING', 'RETRY')"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_row_that_kills_its_enqueuer_is_isolated(
    audited: str, redis_url: str, queue: str, tmp_path: Path
) -> None:
    db_url = audited
    marker = f"kill-{uuid.uuid4().hex[:8]}"
    stream = f"workflow.tasks.{queue}.0"
    healthy = [f"ok-{i}" for i in range(20)]
    with psycopg.connect(db_url) as conn:  # one transaction: they share the first batch
        for row_id in [*healthy[:10], marker, *healthy[10:]]:
            payload = flat_payload(row_id)
            conn.execute(
                INSERT_ONE, {"id": row_id, "stream": stream, "payload": payload, "retries": RETRIES}
            )
    redis = sync_redis.Redis.from_url(redis_url, decode_responses=True)

    def published() -> list[str]:
        streams = queue_streams([queue], 4)
        return [f["outbox_id"] for s in streams for _, f in redis.xrange(s)]

    log = (tmp_path / "enqueuer.log").open("ab")
    flags = [
        *("--database-url", db_url, "--redis-url", redis_url, "--poll-interval", "0.2"),
        *("--maintenance-interval", "0.5", "--no-listen"),
    ]
    crashes = 0
    proc: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + 240
    try:
        while due_rows(db_url):
            assert time.monotonic() < deadline, f"not settled after {crashes} crashes"
            if proc is None or proc.poll() is not None:
                crashes += proc is not None and proc.returncode == 17
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.faults.killer_enqueuer", marker, *flags],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            time.sleep(0.1)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        log.close()
        redis.close()
    assert sorted(published()) == sorted(healthy), "every healthy row published, once"
    dead = dead_letters(db_url)
    assert list(dead) == [marker], "no healthy row reached outbox_dlq"
    assert dead[marker][0] == RETRIES + 1, dead[marker]
    assert charged(db_url) == {marker}, "no attempt charged for someone else's crash"
    assert crashes >= RETRIES + 1
