"""Own server processes for tests: ``redis_process``, ``redis_cluster_process``, ``pg_process``.

Fault tests kill, pause and restart these; the machine's shared services are
never touched. The processes are the demo's (``dispatcher.demo.throwaway``),
the same the demo and the benchmarks start; each is killed at teardown
whatever the test did to it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess
from tests.faults.load import BUSINESS_TABLE
from tests.fix_db import migrate_url
from tests.redis_cluster import RedisClusterProcess

__all__ = ["aof_redis", "own_pg_db_url", "pg_process", "redis_cluster_process", "redis_process"]


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private redis-server for this test; a fault test may stop or pause it."""
    server = RedisProcess(tmp_path / "redis")
    try:
        yield server.start()
    finally:
        server.kill()


@pytest.fixture(scope="session")
def redis_cluster_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterProcess]:
    """The suite's own 3-master Redis Cluster, started once per session."""
    cluster = RedisClusterProcess(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_process() -> Iterator[PostgresProcess]:
    """The suite's own PostgreSQL (started on first use); tests may restart it.

    Not under pytest's temp root: as root the server runs as the postgres OS user,
    which cannot enter that.
    """
    workdir = Path(tempfile.mkdtemp(prefix="od-pg-"))
    server = PostgresProcess(workdir)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def own_pg_db_url(pg_process: PostgresProcess) -> str:
    """A new database on the suite's own PostgreSQL: the outbox schema and the load
    generator's business table (the application's own writes)."""
    url = pg_process.create_database()
    migrate_url(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUSINESS_TABLE)
    return url


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis of the test's own with the append-only file on."""
    server = RedisProcess(tmp_path / "aof", "--appendonly", "yes")
    try:
        yield server.start()
    finally:
        server.kill()
