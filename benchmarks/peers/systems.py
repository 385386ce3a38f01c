"""The four systems as the harness starts them: servers, schema, worker and producer commands.

Every system gets a database of its own on the benchmark's PostgreSQL (``ADMIN_URL``, as
every benchmark) and, where it uses one, a redis-server of its own with AOF (``appendfsync
everysec``, Redis's default). A ``System`` knows its worker processes (their CPU is the
system's), its database (its backends' CPU is the system's: the workers' and the producers'
sessions) and its Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from benchmarks.env import ADMIN_URL, RedisProcess, _migrate
from benchmarks.workload import ROOT

__all__ = ["PEERS", "System", "Variant", "started"]

MAX_WORKERS_RIVER = 1000  # so River's fetches are not what bounds it
CONCURRENCY = 16
VENVS = ROOT / ".venv-peers"
PEERS = ("River", "procrastinate", "Celery")


@dataclass(frozen=True)
class Variant:
    """One system to run: a peer's name, or outbox-dispatcher from a tree (``name=path``)."""

    name: str
    tree: Path | None = None  # outbox-dispatcher's source tree; None for a peer


@dataclass
class System:
    name: str
    db_url: str
    redis: RedisProcess | None
    handled_log: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    producer: list[str] = field(default_factory=list)  # argv before TASKS PER_COMMIT ...
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT

    @property
    def redis_pid(self) -> int:
        return self.redis.proc.pid if self.redis and self.redis.proc else 0


def _python(venv: str) -> str:
    path = VENVS / venv / "bin" / "python"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `make bench-peers` (it builds the peers' venvs)")
    return str(path)


def _river() -> str:
    built = subprocess.run(
        ["bash", str(ROOT / "benchmarks/peers/build_river.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return built.stdout.strip()


@contextlib.contextmanager
def _database() -> Iterator[str]:
    name = f"od_peers_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _commands(variant: Variant, sys_: System) -> list[list[str]]:
    """Set the system's schema and producer up; return its worker commands."""
    env = {**os.environ, **sys_.env}
    log = str(sys_.handled_log)
    if variant.tree is not None:  # outbox-dispatcher, from its tree, with its defaults
        redis_url = sys_.redis.url if sys_.redis else ""
        import asyncio

        asyncio.run(_migrate(sys_.db_url))
        py = sys.executable
        sys_.producer = [py, "-m", "benchmarks.peers.produce", "ours", sys_.db_url]
        return [
            [py, "-m", "dispatcher.cli", "enqueuer", "--database-url", sys_.db_url,
             "--redis-url", redis_url],
            [py, "-m", "dispatcher.cli", "worker", "--queue", "peers", "--redis-url", redis_url,
             "--handler", "benchmarks.peers.ours_handler:handle", "--concurrency",
             str(CONCURRENCY)],
        ]  # fmt: skip
    if variant.name == "River":
        river = _river()
        subprocess.run([river, "migrate", sys_.db_url], check=True, env=env)
        sys_.producer = [river, "produce", sys_.db_url]
        return [[river, "work", sys_.db_url, log, str(MAX_WORKERS_RIVER)]]
    if variant.name == "procrastinate":
        py = _python("procrastinate")
        app = ["-m", "procrastinate", "--app=benchmarks.peers.pc_app.app"]
        subprocess.run([py, *app, "schema", "--apply"], check=True, env=env, cwd=ROOT,
                       capture_output=True)  # fmt: skip
        sys_.producer = [py, "-m", "benchmarks.peers.produce", "procrastinate", sys_.db_url]
        return [[py, *app, "worker", "--concurrency", str(CONCURRENCY)]]
    if variant.name == "Celery":
        py = _python("celery")
        assert sys_.redis is not None
        sys_.producer = [py, "-m", "benchmarks.peers.produce", "celery", sys_.redis.url]
        return [
            [py, "-m", "celery", "-A", "benchmarks.peers.celery_app", "worker", "-P", "threads",
             "-c", str(CONCURRENCY), "-l", "warning"],
        ]  # fmt: skip
    raise ValueError(f"unknown system {variant.name!r}")


@contextlib.contextmanager
def started(variant: Variant) -> Iterator[System]:
    """The system's servers, schema and workers, up for the block; all stopped after."""
    workdir = Path(tempfile.mkdtemp(prefix="od-peers-"))
    redis: RedisProcess | None = None
    if variant.tree is not None or variant.name == "Celery":
        redis = RedisProcess(workdir / "redis", "--appendonly", "yes", "--appendfsync", "everysec")
        redis.start()
    try:
        with _database() as db_url:
            handled = workdir / "handled.log"
            handled.touch()
            tree = _source(variant.tree, workdir)
            system = System(
                name=variant.name, db_url=db_url, redis=redis, handled_log=handled, cwd=tree,
                env={
                    "PEERS_HANDLED_LOG": str(handled),
                    "PEERS_DATABASE_URL": db_url,
                    "PEERS_REDIS_URL": redis.url if redis else "",
                    "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(tree), str(ROOT)])),
                },
            )  # fmt: skip
            commands = _commands(variant, system)
            out = (workdir / "workers.log").open("wb")
            env = {**os.environ, **system.env}
            system.workers = [
                subprocess.Popen(c, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
                for c in commands
            ]
            try:
                yield system
            finally:
                _stop(system.workers)
                out.close()
    finally:
        if redis is not None:
            redis.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def _source(tree: Path | None, workdir: Path) -> Path:
    """Where the system's processes start: this checkout, or a directory whose ``dispatcher``
    is another tree's (the harness's ``benchmarks`` package then still comes from here)."""
    if tree is None or tree.resolve() == ROOT.resolve():
        return ROOT
    shadow = workdir / "src"
    shadow.mkdir()
    (shadow / "dispatcher").symlink_to(tree.resolve() / "dispatcher")
    return shadow


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
