"""The local cluster leaves the machine as it found it, even when its test session is killed.

A cluster of a session that was SIGKILLed keeps running (its processes are in sessions of
their own) with a Pod on its node: the next start must stop it and remove what it left
(processes, mounts, cgroups, iptables chains, network namespaces, containerd's state) before
it starts; a stop must then leave nothing at all. These tests start clusters of their own, so
they run before the session's (``own_cluster``, ordered by ``tests/e2e/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.waiting import eventually_sync
from tools.cluster import start, stop
from tools.cluster.binaries import ROOT
from tools.cluster.control_plane import load
from tools.cluster.leftovers import inventory

pytestmark = [pytest.mark.own_cluster, pytest.mark.timeout(900)]

# A "test session": it starts a cluster it owns, runs a Pod on the node, says so, and waits.
SESSION = """
import json, os, subprocess, sys, time
from collections.abc import Callable, Iterator
from pathlib import Path
from tools.cluster import start
cluster = start(Path(sys.argv[1]), owner=os.getpid())
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
       "spec": {"containers": [{"name": "main", "image": "outbox-dispatcher-worker:0.1.0",
                                "command": ["sleep", "3600"]}]}}
cluster.run("kubectl", "apply", "-f", "-", stdin=json.dumps(pod))
cluster.run("kubectl", "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=180s")
print("running", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def short_dir() -> Iterator[Callable[[str], Path]]:
    """State dirs short enough for containerd's sockets (pytest's tmp_path may not be),
    removed after the test (their clusters are stopped by then)."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(Path(tempfile.mkdtemp(prefix=f"od-{name}-")))
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def sleepers() -> list[str]:
    """The processes of the killed session's Pod (``sleep 3600``)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.joinpath("cmdline").read_bytes() == b"sleep\x003600\x00":
                found.append(proc.name)
        except OSError:
            continue
    return found


def test_a_killed_sessions_cluster_is_removed_by_the_next_start_and_a_stop_leaves_nothing(
    short_dir: Callable[[str], Path],
) -> None:
    killed = short_dir("killed")
    session = subprocess.Popen(
        [sys.executable, "-c", SESSION, str(killed)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert session.stdout is not None
        assert session.stdout.readline().strip() == "running"
    finally:
        session.send_signal(signal.SIGKILL)
        session.wait()
    # Killed, its cluster and its Pod run on: the processes, the Pod's mounts, network
    # namespace and cgroups, the node's chains.
    left = inventory(killed)
    assert any(line.startswith("process") for line in left), left
    assert any(line.startswith("mount") for line in left), left
    assert any(line.startswith("cgroup") for line in left), left
    assert any(line.startswith("iptables") for line in left), left
    assert sleepers()

    fresh = short_dir("next")
    cluster = start(fresh, owner=os.getpid())
    try:
        # The killed session's cluster is gone, and nothing of it is left.
        assert [line for line in inventory(killed) if killed.name in line] == []
        assert load(killed) is None
        assert not sleepers(), "the killed session's Pod still runs"
        cluster.run("kubectl", "get", "nodes")
    finally:
        stop(fresh)
    left = inventory(fresh)
    assert left == [], left


def test_a_cluster_that_is_wanted_is_never_taken_over(short_dir: Callable[[str], Path]) -> None:
    """``make cluster``'s cluster (no owner: it outlives its command) is refused, not stopped."""
    first_dir = short_dir("first")
    first = start(first_dir)  # as `make cluster` starts it
    try:
        with pytest.raises(RuntimeError, match="a local cluster runs already"):
            start(short_dir("second"), owner=os.getpid())
        eventually_sync(lambda: first.run("kubectl", "get", "nodes") != "", within=30)
    finally:
        stop(first_dir)
    assert inventory(first_dir) == []
