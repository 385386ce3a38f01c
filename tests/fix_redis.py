"""Redis fixtures: an isolated database on the suite's own Redis, and the suite's Cluster.

The suite's Redis is one it starts itself (``tests.suite_servers``), or the one
``TEST_REDIS_URL`` names. Each test gets its own DB number (flushed before use)
and its own queue name. On the suite's Cluster (DB 0 only) each test uses its
own queue names and deletes the keys it made.

DB numbers are only unique within one test session, so two sessions on the same
Redis (``TEST_REDIS_URL``) would flush each other's databases mid-test: a session
takes its turn (``shared_redis_turn``, a lock file per Redis address) before its
first test that uses that Redis, and keeps it to the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import sys
import tempfile
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis as sync_redis

from dispatcher.demo.throwaway import RedisProcess
from dispatcher.redis_client import RedisClient, connect_redis
from tests.redis_cluster import RedisClusterProcess
from tests.suite_servers import redis_base_url

_db_numbers = itertools.cycle(range(1, 16))


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"q{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def shared_redis_turn(url: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock of the Redis at ``url`` for the block; False if busy and not ``wait``."""
    where = urllib.parse.urlsplit(url)
    name = f"outbox-dispatcher-tests-{where.hostname}-{where.port or 6379}.lock"
    with (Path(tempfile.gettempdir()) / name).open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            print(f"\nwaiting for another test session on {url} to end", file=sys.__stderr__)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield True  # the lock goes with the file's close


@pytest.fixture(scope="session")
def _shared_redis_alone() -> Iterator[None]:
    with shared_redis_turn(redis_base_url()):
        yield


def _fresh_db() -> str:
    url = f"{redis_base_url()}/{next(_db_numbers)}"
    client = sync_redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def redis_url(_shared_redis_alone: None) -> str:
    """URL of a freshly flushed DB on the suite's Redis, for this test alone."""
    return _fresh_db()


@pytest.fixture
def another_redis_url(redis_url: str) -> str:
    """A second freshly flushed DB, other than ``redis_url``'s (two dispatchers, two databases)."""
    return _fresh_db()


@pytest.fixture
async def redis_standalone(redis_url: str) -> AsyncIterator[RedisClient]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def redis_cluster(redis_cluster_process: RedisClusterProcess) -> AsyncIterator[RedisClient]:
    client = connect_redis(redis_cluster_process.url, cluster=True)
    await client.initialize()
    yield client
    await client.aclose()


@pytest.fixture(params=["standalone", "cluster"])
async def any_redis(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[RedisClient]:
    """The same test on the suite's Redis and on its own 3-master Cluster."""
    if request.param == "cluster":
        cluster: RedisClusterProcess = request.getfixturevalue("redis_cluster_process")
        client = connect_redis(cluster.url, cluster=True)
    else:
        client = connect_redis(redis_url)
    yield client
    await client.aclose()


DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"


def documented_acl(passwords: dict[str, str]) -> list[list[str]]:
    """The ``ACL SETUSER`` lines of docs/security.md, with real passwords."""
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("ACL SETUSER ")]
    assert {line.split()[2] for line in lines} == set(passwords), lines
    return [
        line.replace(">CHANGE-ME", ">" + passwords[line.split()[2]]).split()[2:] for line in lines
    ]


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[tuple[RedisProcess, dict[str, str]]]:
    """A Redis of the test's own with the users of docs/security.md (and their passwords)."""
    passwords = {
        "dispatcher-enqueuer": f"enq-{uuid.uuid4().hex}",
        "dispatcher-worker": f"wrk-{uuid.uuid4().hex}",
        "dispatcher-operator": f"op-{uuid.uuid4().hex}",
    }
    server = RedisProcess(tmp_path / "acl-redis").start()
    admin = sync_redis.Redis(port=server.port)
    for args in documented_acl(passwords):
        assert admin.execute_command("ACL", "SETUSER", *args) in (b"OK", "OK", True)
    admin.execute_command("ACL", "LOG", "RESET")
    admin.close()
    try:
        yield server, passwords
    finally:
        server.kill()


def user_url(port: int, user: str, password: str, scheme: str = "redis", query: str = "") -> str:
    return f"{scheme}://{user}:{quote(password, safe='')}@127.0.0.1:{port}/0{query}"
