"""The fault harness: one pipeline under test, its processes, its load and its verdict.

A ``Pipeline`` owns a fresh database (on the suite's own PostgreSQL), the
Redis under test (own redis-server or Cluster, maybe behind a ``TcpProxy``),
the enqueuer and worker processes (``python -m dispatcher.cli ...``, logs in
files) and a load generator. ``verify()`` waits for the drain and asserts
the checker's invariants; in long mode it also records the report.

``Scale`` is the short/long switch: the short form (default, CI) runs a few
hundred tasks per scenario; ``FAULTS_LONG=1`` (``make faults``) a few
thousand, with more rounds of each fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as sync_redis

from tests.faults.checker import Report, check, record_result, snapshot
from tests.faults.load import LoadGenerator, LoadSpec
from tests.waiting import eventually_sync

__all__ = ["LONG", "Pipeline", "Proc", "Scale", "scale"]

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("FAULTS_LONG", "") not in ("", "0")

ENQUEUER_FLAGS = (
    *("--poll-interval", "0.2", "--hung-batch-timeout", "3"),
    *("--maintenance-interval", "0.5", "--publish-timeout", "1", "--shutdown-timeout", "2"),
    *("--batch-size", "50", "--concurrency", "2"),
)
WORKER_FLAGS = (
    *("--handler", "tests.handlers:record", "--concurrency", "8", "--reclaim-idle", "1"),
    *("--lease-ttl", "2", "--max-runs", "10", "--grace-period", "2"),
)


@dataclass(frozen=True, slots=True)
class Scale:
    tasks: int
    rate: float
    rounds: int
    drain_within: float


def scale() -> Scale:
    if LONG:
        return Scale(tasks=3000, rate=150, rounds=10, drain_within=240)
    return Scale(tasks=300, rate=100, rounds=3, drain_within=90)


class Proc:
    """One dispatcher process; its output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, name: str) -> None:
        self.args, self.env, self.log, self.name = args, env, log, name
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        if self.alive():
            assert self.popen is not None
            os.kill(self.pid, signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(10)

    def terminate(self, timeout: float = 15, *, signalled: bool = False) -> int | None:
        """SIGTERM (unless ``signalled`` already: a second one cancels) and wait; then kill."""
        if not self.alive():
            return self.popen.returncode if self.popen else None
        assert self.popen is not None
        if not signalled:
            os.kill(self.pid, signal.SIGCONT)
            self.popen.terminate()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Pipeline:
    def __init__(
        self,
        *,
        scenario: str,
        db_url: str,
        redis_url: str,
        recorder_url: str,
        workdir: Path,
        cluster: bool = False,
        shards: int = 4,
    ) -> None:
        self.scenario = scenario
        self.db_url = db_url
        self.redis_url = redis_url
        self.recorder_url = recorder_url
        self.cluster = cluster
        self.shards = shards
        self.workdir = workdir
        self.queue = f"f{uuid.uuid4().hex[:8]}"
        self.record_key = f"runs:{self.queue}"
        self.procs: list[Proc] = []
        self.load: LoadGenerator | None = None
        self.started = time.monotonic()
        self.faults: dict[str, Any] = {}
        self.recorder = sync_redis.Redis.from_url(recorder_url, decode_responses=True)
        self.redis: Any = (
            sync_redis.RedisCluster.from_url(redis_url, decode_responses=True)
            if cluster
            else sync_redis.Redis.from_url(redis_url, decode_responses=True)
        )

    # -- processes ----------------------------------------------------------------

    def _env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "REDIS_URL": self.redis_url,
            "REDIS_CLUSTER": "1" if self.cluster else "0",
            "STREAM_SHARDS": str(self.shards),
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def _spawn(self, kind: str, name: str, flags: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}.log"
        args = [sys.executable, "-m", "dispatcher.cli", kind, *flags]
        proc = Proc(args, env, log, name).start()
        self.procs.append(proc)
        return proc

    def enqueuer(
        self,
        *flags: str,
        redis_url: str | None = None,
        name: str = "",
        env: dict[str, str] | None = None,
    ) -> Proc:
        """``dispatcher enqueuer``; ``redis_url``/``env`` override the pipeline's settings."""
        name = name or f"enqueuer-{len(self.procs)}"
        overrides = {**({"REDIS_URL": redis_url} if redis_url else {}), **(env or {})}
        return self._spawn("enqueuer", name, [*ENQUEUER_FLAGS, *flags], self._env(**overrides))

    def worker(
        self,
        *flags: str,
        redis_url: str | None = None,
        name: str = "",
        env: dict[str, str] | None = None,
    ) -> Proc:
        name = name or f"worker-{len(self.procs)}"
        env = self._env(
            FAULT_RECORD_URL=self.recorder_url,
            FAULT_RECORD_KEY=self.record_key,
            FAULT_CONSUMER=name,
            **({"REDIS_URL": redis_url} if redis_url else {}),
            **(env or {}),
        )
        flags_all = ["--queue", self.queue, "--consumer", name, *WORKER_FLAGS, *flags]
        return self._spawn("worker", name, flags_all, env)

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        for proc in self.procs:
            proc.terminate(timeout=10, signalled=True)
        if self.load:
            self.load.stop()
        self.recorder.close()
        self.redis.close()

    # -- load ---------------------------------------------------------------------

    def start_load(self, spec: LoadSpec, *, db_url: str | None = None) -> LoadGenerator:
        """Start the load (as ``db_url``'s role if given; the checker keeps ``self.db_url``)."""
        self.load = LoadGenerator(db_url=db_url or self.db_url, queue=self.queue, spec=spec).start()
        return self.load

    def handled(self) -> int:
        return int(self.recorder.llen(self.record_key))  # type: ignore[arg-type]

    def progress(self, *, by: int = 20, within: float = 60) -> None:
        """Wait until ``by`` more runs are recorded, or the load has ended: the pipeline moves."""
        before = self.handled()
        eventually_sync(
            lambda: self.handled() >= before + by or bool(self.load and self.load.done),
            within=within,
            what=f"{by} more tasks handled",
        )

    def fault(self, name: str, count: int = 1) -> None:
        self.faults[name] = self.faults.get(name, 0) + count

    # -- verdict ------------------------------------------------------------------

    def verify(
        self, *, within: float, duplicates_allowed: bool = False, loss_allowed: bool = False
    ) -> Report:
        """Drain, check every invariant, record the report (long mode), return it.

        ``loss_allowed`` is for a scenario that measures a documented trade (Redis acked an
        entry that no replica had yet when its master died): the loss is recorded, not
        asserted, and every other invariant still holds.
        """
        assert self.load is not None
        self.load.wait()
        report = check(
            scenario=self.scenario,
            load=self.load,
            read=lambda: snapshot(
                load=self.load,  # type: ignore[arg-type]
                db_url=self.db_url,
                redis=self.redis,
                recorder=self.recorder,
                key=self.record_key,
            ),
            within=within,
            started=self.started,
            loss_expected=loss_allowed,
        )
        report.faults = dict(self.faults)
        print(report.summary())  # shown with -s, and on failure
        context = f"{report.summary()}\n{self._logs()}"
        assert report.committed > 0, context
        if not loss_allowed:
            assert not report.lost, "committed tasks lost\n" + context
        assert not report.unexpected, "tasks handled that never committed\n" + context
        assert not report.leftover_rows, "outbox rows left behind\n" + context
        assert report.stream_entries == 0, "task streams not empty\n" + context
        assert report.pending_entries == 0, "PELs not empty\n" + context
        if not duplicates_allowed:
            assert report.duplicates == 0, "duplicate handler runs\n" + context
        record_result(report, long=LONG)
        return report

    def _logs(self) -> str:
        return "\n".join(f"--- {p.name} (alive={p.alive()})\n{p.tail()}" for p in self.procs)
