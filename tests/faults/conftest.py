"""Fixtures of the fault suite: the recorder, a fresh database, pipelines, own Redis servers.

Fault scenarios use the suite's own PostgreSQL (``pg_process``; scenario 7
restarts it) and their own redis-server processes, never the machine's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dispatcher.demo.throwaway import RedisProcess
from tests.faults.harness import Pipeline
from tests.fix_proxy import TcpProxy
from tests.redis_cluster import RedisClusterProcess
from tests.waiting import eventually_sync


@pytest.fixture(scope="session")
def recorder() -> Iterator[RedisProcess]:
    """Where handler runs are logged: a redis-server no scenario ever faults."""
    workdir = Path(tempfile.mkdtemp(prefix="od-recorder-"))
    server = RedisProcess(workdir).start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Callable[..., RedisProcess]]:
    """Start redis-servers with extra settings (``own_redis("--appendonly", "yes")``)."""
    started: list[RedisProcess] = []

    def start(*extra: str) -> RedisProcess:
        server = RedisProcess(tmp_path / f"redis{len(started)}", *extra).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def proxied_redis(
    own_redis: Callable[..., RedisProcess], tcp_proxy: type[TcpProxy]
) -> tuple[RedisProcess, TcpProxy]:
    """An own redis-server and a started proxy in front of it, to blackhole or slow at will."""
    redis = own_redis()
    return redis, tcp_proxy(redis.port).start()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Callable[..., RedisClusterProcess]]:
    started: list[RedisClusterProcess] = []

    def start(*, replicas: int = 0) -> RedisClusterProcess:
        cluster = RedisClusterProcess(tmp_path / "cluster", replicas=replicas)
        for node in cluster.nodes:  # replicas sync at once, not after the default 5 s
            node.extra = (*node.extra, "--repl-diskless-sync-delay", "0")
        started.append(cluster.start())
        for node in cluster.nodes:  # a replica that never synced would never be promoted
            eventually_sync(
                lambda n=node: "master_link_status:down" not in n.cli("INFO"), within=30
            )
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def pipeline(
    request: pytest.FixtureRequest, own_pg_db_url: str, recorder: RedisProcess, tmp_path: Path
) -> Iterator[Callable[..., Pipeline]]:
    """``pipeline(redis_url, cluster=False)``: the scenario's pipeline, stopped at teardown."""
    made: list[Pipeline] = []

    def make(redis_url: str, *, cluster: bool = False) -> Pipeline:
        p = Pipeline(
            scenario=request.node.name.removeprefix("test_"),
            db_url=own_pg_db_url,
            redis_url=redis_url,
            recorder_url=recorder.url,
            workdir=tmp_path,
            cluster=cluster,
        )
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop_all()
