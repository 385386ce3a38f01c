"""Own PostgreSQL server for tests that restart it or need cluster-wide objects (roles).

The machine runs as root and PostgreSQL refuses to: ``initdb`` and the server
run as the ``postgres`` OS user (``runuser``), with a data directory it owns
under a temp dir. Trust authentication on loopback only, fsync off (a crash
of the test machine loses nothing we care about), a free port, and the
socket in the temp dir so nothing collides with the machine's cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.faults.load import BUSINESS_TABLE
from tests.fix_db import migrate_url
from tests.fix_servers import free_port, wait_until

__all__ = ["PostgresProcess", "own_pg_db_url", "pg_process"]

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"


def _as_postgres(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", PG_USER, "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=timeout, check=True
    )


class PostgresProcess:
    """One PostgreSQL cluster on a free loopback port: start, restart (fast), stop."""

    def __init__(self, workdir: Path, *settings: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data = workdir / "data"
        self.settings = settings

    def url(self, database: str = "postgres", user: str = PG_USER, password: str = "") -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        self.data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.data, PG_USER, PG_USER)
        _as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", PG_USER,
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip
        options = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.data}'",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            for key, value in options.items():
                conf.write(f"{key} = {value}\n")
            for line in self.settings:
                conf.write(line + "\n")
        self._ctl("start", "-w", "-l", str(self.data / "server.log"))
        return self

    def _ctl(self, *args: str) -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args, timeout=90)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is cut, the server is back on return."""
        self._ctl("restart", "-m", "fast", "-w", "-l", str(self.data / "server.log"))
        wait_until(self.ready, timeout=30)

    def ready(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._ctl("stop", "-m", "immediate", "-w")

    def create_database(self, prefix: str = "od") -> str:
        """A new empty database; return its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def log_tail(self, lines: int = 30) -> str:
        path = self.data / "server.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def pg_process() -> Iterator[PostgresProcess]:
    """The suite's own PostgreSQL (started on first use); tests may restart it."""
    workdir = Path(tempfile.mkdtemp(prefix="od-pg-"))
    server = PostgresProcess(workdir).start()
    try:
        yield server
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
