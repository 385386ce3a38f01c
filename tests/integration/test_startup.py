"""Start-up against backends that are down or silent: retried with backoff, never a hang.

A silent server accepts the TCP connection (the kernel completes the handshake
into the listen backlog) and never says a word: without a connect timeout a
client waits for it as long as the kernel keeps the connection.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dispatcher.demo.throwaway import free_port
from tests.data import insert_rows
from tests.enqueuers import spawn_enqueuer
from tests.fix_proxy import TcpProxy
from tests.fix_worker_process import ROOT
from tests.outbox_rows import outbox_status
from tests.waiting import eventually_sync


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never reads or writes."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield int(server.getsockname()[1])


def status(port: int, path: str) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).status)
    except urllib.error.HTTPError as exc:
        return exc.code


def sigterm(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then the exit code once the process has gone."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=15)


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill what a failed test left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_an_enqueuer_whose_database_is_silent_retries_serving_healthz(
    silent_port: int, outbox_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "enqueuer.log"
    metrics = free_port()
    db = f"postgresql://postgres@127.0.0.1:{silent_port}/outbox"  # the default connect timeout
    proc = spawn_enqueuer(db, redis_url, log, "--metrics-port", str(metrics))
    try:
        eventually_sync(lambda: "trying again" in log.read_text(), within=40)
        assert status(metrics, "/healthz") == 200
        assert status(metrics, "/readyz") == 503
        assert proc.poll() is None
        text = log.read_text()
        assert "connecting to PostgreSQL and Redis failed" in text
        assert "timeout" in text, text
        assert sigterm(proc) == 0
    finally:
        reap(proc)


def test_an_enqueuer_started_while_its_database_is_silent_dispatches_once_it_answers(
    outbox_db_url: str, redis_url: str, tmp_path: Path, tcp_proxy: type[TcpProxy]
) -> None:
    server = psycopg.conninfo.conninfo_to_dict(outbox_db_url)
    proxy = tcp_proxy(int(server["port"])).start()
    proxy.blackhole()
    through = psycopg.conninfo.make_conninfo(outbox_db_url, port=proxy.port, connect_timeout=1)
    log = tmp_path / "enqueuer.log"
    proc = spawn_enqueuer(through, redis_url, log, "--metrics-port", "0")
    try:
        eventually_sync(lambda: "trying again" in log.read_text(), within=30)
        insert_rows(outbox_db_url, 20, queue="startup", prefix="s-")
        proxy.heal()
        eventually_sync(lambda: outbox_status(outbox_db_url) == {}, within=60)
        assert proc.poll() is None
        assert sigterm(proc) == 0
    finally:
        reap(proc)


def test_a_worker_whose_redis_is_silent_retries_serving_healthz(
    silent_port: int, tmp_path: Path
) -> None:
    metrics = free_port()
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "dispatcher.cli", "worker"),
                *("--redis-url", f"redis://127.0.0.1:{silent_port}/0"),
                *("--queue", "startup", "--handler", "tests.handlers:noop"),
                *("--metrics-port", str(metrics)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,  # where tests.handlers imports from
        )
    try:
        eventually_sync(lambda: "trying again" in log.read_text(), within=40)
        assert status(metrics, "/healthz") == 200
        assert status(metrics, "/readyz") == 503
        assert "connecting to Redis failed" in log.read_text()
        assert sigterm(proc) == 0
    finally:
        reap(proc)
