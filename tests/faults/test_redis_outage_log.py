"""Redis down for a few seconds: one warning when it goes, one line when it is back, per process.

Not one per shard per retry: a worker reading 8 shards and an enqueuer each say
"Redis is down" once and "Redis is back after N s" once, whatever the retries
in between (those are at DEBUG).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from dispatcher.demo.throwaway import RedisProcess
from tests.data import insert_rows
from tests.enqueuers import spawn_enqueuer
from tests.fix_worker_process import ROOT
from tests.waiting import eventually_sync

DOWN = "Redis is down"
BACK = "Redis is back after"


def spawn_worker(redis_url: str, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "dispatcher.cli", "worker", "--redis-url", redis_url),
                *("--queue", "outage", "--handler", "tests.handlers:noop"),
                *("--shards", "8", "--metrics-port", "0"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,  # where tests.handlers imports from
        )


def test_a_redis_outage_is_one_warning_and_one_line_when_it_ends(
    outbox_db_url: str, redis_process: RedisProcess, tmp_path: Path
) -> None:
    worker_log, enqueuer_log = tmp_path / "worker.log", tmp_path / "enqueuer.log"
    worker = spawn_worker(redis_process.url, worker_log)
    enqueuer = spawn_enqueuer(
        outbox_db_url, redis_process.url, enqueuer_log, "--shards", "8", "--metrics-port", "0"
    )
    try:
        eventually_sync(lambda: "outbox enqueuer starting" in enqueuer_log.read_text(), within=60)
        eventually_sync(lambda: "worker" in worker_log.read_text(), within=60)
        redis_process.stop()
        insert_rows(outbox_db_url, 20, queue="outage", prefix="o-")  # batches that must fail
        # Several retries of every loop (their backoff reaches 5 s) while Redis is down.
        eventually_sync(
            lambda: DOWN in worker_log.read_text() and DOWN in enqueuer_log.read_text(),
            within=60,
        )
        time.sleep(6)  # the outage itself: retries happen meanwhile, and must stay quiet
        redis_process.start()
        eventually_sync(
            lambda: BACK in worker_log.read_text() and BACK in enqueuer_log.read_text(),
            within=60,
        )
        for proc in (worker, enqueuer):
            proc.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        assert enqueuer.wait(timeout=60) == 0
    finally:
        for proc in (worker, enqueuer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for log in (worker_log, enqueuer_log):
        warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
        down = [line for line in warnings if DOWN in line]
        back = [line for line in log.read_text().splitlines() if BACK in line]
        assert len(down) == 1, log.read_text()
        assert len(back) == 1, log.read_text()
        # No other warning about the connection (a lost consumer group is another matter).
        others = [line for line in warnings if line not in down + back]
        assert [line for line in others if "onnect" in line] == [], log.read_text()
