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

__all__ = ["alive", "free_port", "runs", "spawn", "terminate"]


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


def runs(pid: int, *, needle: str) -> bool:
    """Whether ``pid`` is alive and its command line names ``needle`` (a recorded pid of a
    process that died long ago may belong to another process by now)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return needle in cmdline


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
