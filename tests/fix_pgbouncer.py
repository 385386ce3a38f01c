"""A real PgBouncer (Debian's package) in front of the suite's PostgreSQL, per test.

It runs as the ``postgres`` OS user (PgBouncer refuses root) on a free loopback
port with its files in a temp dir, forwards every database name to the suite's
PostgreSQL as its superuser, and is killed at teardown; its output is kept in
its log, which a failure to start shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dispatcher.demo.throwaway import free_port
from tests.suite_servers import postgres_admin_url
from tests.waiting import eventually_sync

__all__ = ["pgbouncer"]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncerProcess:
    def __init__(self, workdir: Path, pool_mode: str, ignore: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        config = workdir / "pgbouncer.ini"
        server = psycopg.conninfo.conninfo_to_dict(postgres_admin_url())
        config.write_text(
            "[databases]\n"
            f"* = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)}"
            f" user={server.get('user', 'postgres')}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {workdir}\n"
            "auth_type = any\n"
            f"pool_mode = {pool_mode}\n"
            "default_pool_size = 20\nmax_client_conn = 200\n"
            f"ignore_startup_parameters = {ignore}\n"
            f"logfile = {workdir}/pgbouncer.log\npidfile = {workdir}/pgbouncer.pid\n"
        )
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        with (workdir / "pgbouncer.out").open("wb") as out:
            self.proc = subprocess.Popen(
                [*as_postgres, PGBOUNCER, str(config)], stdout=out, stderr=subprocess.STDOUT
            )

    def url(self, database_url: str) -> str:
        """``database_url`` (a database on the machine's server) reached through the pooler."""
        name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def output(self) -> str:
        """What the process printed and logged: why it did not come up, if it did not."""
        out = self.workdir / "pgbouncer.out"
        printed = out.read_text(errors="replace") if out.exists() else ""
        return f"exit code: {self.proc.poll()}\n{printed}{self.log()}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def pgbouncer() -> Iterator[Callable[..., PgBouncerProcess]]:
    """Start PgBouncers: ``pgbouncer(pool_mode, ignore_startup_parameters="options")``."""
    started: list[PgBouncerProcess] = []
    workdirs: list[str] = []

    def start(pool_mode: str, ignore: str = "extra_float_digits") -> PgBouncerProcess:
        workdir = tempfile.mkdtemp(prefix="od-pgbouncer-")
        workdirs.append(workdir)
        os.chmod(workdir, 0o777)
        bouncer = PgBouncerProcess(Path(workdir), pool_mode, ignore)
        started.append(bouncer)
        probe = f"postgresql://postgres@127.0.0.1:{bouncer.port}/postgres"
        try:
            eventually_sync(
                lambda: psycopg.connect(probe, connect_timeout=1).close() is None,
                ignoring=(psycopg.OperationalError,),
            )
        except AssertionError as exc:
            pytest.fail(f"PgBouncer did not come up ({exc}):\n{bouncer.output()}")
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()
    for workdir in workdirs:
        shutil.rmtree(workdir, ignore_errors=True)
