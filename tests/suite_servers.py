"""The suite's own PostgreSQL and Redis: started on first use, stopped when the session ends.

The suite never writes to a server it did not start: by default every test
database lives on a PostgreSQL this module starts (``dispatcher.demo.throwaway``,
a free loopback port, trust on loopback, its files in a temp dir) and every
test's Redis DB number on a redis-server it starts the same way. Nothing needs
to listen on 5432 or 6379, and a running shared Redis keeps its data.

``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` point the suite at servers of your
own instead (the tests create and drop their own databases there, and flush
Redis DB numbers 1-15); use them only for servers nothing else uses.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess

__all__ = ["postgres_admin_url", "redis_base_url", "stop_all"]

_started: list[PostgresProcess | RedisProcess] = []
_workdirs: list[Path] = []


def _workdir(prefix: str) -> Path:
    # Not under pytest's temp root: as root, PostgreSQL runs as the postgres OS user.
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _workdirs.append(path)
    return path


@functools.cache
def postgres_admin_url() -> str:
    """A superuser URL on the suite's PostgreSQL (``TEST_DATABASE_URL`` if set)."""
    if os.environ.get("TEST_DATABASE_URL"):
        return os.environ["TEST_DATABASE_URL"]
    server = PostgresProcess(_workdir("od-suite-pg-"), "max_connections = 300")
    _started.append(server)
    server.start()
    return server.url()


@functools.cache
def redis_base_url() -> str:
    """``redis://host:port`` of the suite's Redis, no DB number (``TEST_REDIS_URL`` if set)."""
    if os.environ.get("TEST_REDIS_URL"):
        return os.environ["TEST_REDIS_URL"].rstrip("/")
    server = RedisProcess(_workdir("od-suite-redis-"), "--databases", "16")
    _started.append(server)
    server.start()
    return f"redis://127.0.0.1:{server.port}"


def stop_all() -> None:
    """Stop what this module started and remove its files (idempotent)."""
    while _started:
        server = _started.pop()
        if isinstance(server, PostgresProcess):
            server.stop()
        else:
            server.kill()
    while _workdirs:
        shutil.rmtree(_workdirs.pop(), ignore_errors=True)


atexit.register(stop_all)
