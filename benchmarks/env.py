"""Benchmark environment: a private redis-server and a fresh database, torn down after.

Benchmarks never touch the machine's shared Redis data or existing databases:
Redis is the benchmark's own process on a free port, PostgreSQL a database
created for the run on the machine's server (or ``BENCH_DATABASE_URL``'s).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.outbox.schema import migrate

__all__ = ["ADMIN_URL", "BenchEnv", "RedisProcess", "bench_env", "machine_facts"]

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class BenchEnv:
    db_url: str
    redis_url: str
    redis_pid: int = 0  # the benchmark's own redis-server (its CPU is measured)


@contextlib.contextmanager
def bench_env() -> Iterator[BenchEnv]:
    workdir = Path(tempfile.mkdtemp(prefix="od-bench-"))
    redis = RedisProcess(workdir / "redis").start()
    name = f"od_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    db_url = psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    # As `dispatcher migrate` does (versions recorded), in a thread of its own: the caller may
    # be on an event loop already.
    with concurrent.futures.ThreadPoolExecutor(1) as one:
        one.submit(asyncio.run, _migrate(db_url)).result()
    try:
        yield BenchEnv(db_url=db_url, redis_url=redis.url, redis_pid=redis.proc.pid)
    finally:
        redis.kill()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(workdir, ignore_errors=True)


async def _migrate(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await migrate(conn)


def machine_facts() -> dict[str, str]:
    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "?"

    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "postgresql": str(row[0]) if row else "?",
        "redis": version(["redis-server", "--version"]).split(" ")[2].removeprefix("v="),
    }
