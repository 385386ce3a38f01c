"""The cluster's processes: started in sessions of their own with a log each, checked, and
stopped (SIGTERM, then SIGKILL to the group after a grace period), also from another process
than the one that started them (``make cluster-down``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["alive", "free_port", "kill_leftover_containers", "spawn", "terminate"]


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn(name: str, argv: list[str], logs: Path) -> int:
    """Start ``argv`` with its output in ``logs/<name>.log``; return its pid."""
    with (logs / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process.pid


def alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: ask the kernel whether it exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return waited == 0


def terminate(pid: int, *, grace: float) -> None:
    """SIGTERM, then SIGKILL to its process group after ``grace`` seconds; return once gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)


def kill_leftover_containers(pods_dir: Path) -> None:
    """SIGKILL the containers a killed kubelet left running (each records its pid while it runs;
    a pid counts only while that process still runs in its Pod's directory)."""
    for recorded in pods_dir.glob("*/*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(recorded.read_text())
            if os.readlink(f"/proc/{pid}/cwd") == str(recorded.parent):
                os.killpg(pid, signal.SIGKILL)
