"""Own server processes for tests: redis-server (standalone and a 3-master Cluster).

Fault tests kill, pause and restart these; the machine's shared services are
never touched. Every process listens on a free loopback port, keeps its files
in a temp dir, and is killed at teardown whatever the test did to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["RedisClusterProcess", "RedisProcess", "free_port", "wait_until"]


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


def wait_until(predicate: object, *, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate()`` until it is truthy; fail the test after ``timeout``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RedisProcess:
    """One redis-server on a free loopback port; start/stop/kill/pause at will."""

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
        args = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--appendonly", "no",
            "--logfile", str(self.dir / "redis.log"), *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.cli("PING") == "PONG", timeout=10)
        return self

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        return out.stdout.strip()

    def stop(self) -> None:
        """Terminate and wait: the port is closed when this returns."""
        if self.proc and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        wait_until(lambda: not _port_open(self.port), timeout=5)

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


class RedisClusterProcess:
    """A Redis Cluster of ``masters`` masters (and ``replicas`` per master) on loopback."""

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 0) -> None:
        self.nodes = [
            RedisProcess(
                workdir / f"node{i}",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            )
            for i in range(masters * (1 + replicas))
        ]
        self.replicas = replicas

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterProcess:
        for node in self.nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        for node in self.nodes:
            wait_until(lambda n=node: "cluster_state:ok" in n.cli("CLUSTER", "INFO"), timeout=30)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private redis-server for this test; a fault test may stop or pause it."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def redis_cluster_process() -> Iterator[RedisClusterProcess]:
    """The suite's own 3-master Redis Cluster, started once per session."""
    workdir = Path(tempfile.mkdtemp(prefix="od-cluster-"))
    cluster = RedisClusterProcess(workdir).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
