"""``dispatcher demo`` with nothing to connect to: own servers, a PASS, nothing left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import eventually_sync


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.fixture
def demo_tmpdir() -> Iterator[Path]:
    """The demo's TMPDIR, reachable by PostgreSQL running as the postgres OS user (as root)."""
    path = Path(tempfile.mkdtemp(prefix="od-demo-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_demo_starts_its_own_servers_and_cleans_up(demo_tmpdir: Path) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": "postgresql://demo@127.0.0.1:1/nowhere",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "TMPDIR": str(demo_tmpdir),
    }
    out = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "demo", "--tasks", "2000", "--seed", "7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert out.returncode == 0, out.stdout + out.stderr
    assert "DATABASE_URL does not answer" in out.stdout
    assert "PostgreSQL: throwaway" in out.stdout
    assert "Redis: throwaway" in out.stdout
    assert "PASS" in out.stdout
    committed, rolled_back = _row(out.stdout, "committed / rolled back").split(" / ")
    assert int(committed) + int(rolled_back) == 2000
    assert int(rolled_back) > 0, "the demo rolls some transactions back"
    assert _row(out.stdout, "handled (unique)") == committed
    assert list(demo_tmpdir.iterdir()) == [], "temp dirs left behind"
    assert processes_mentioning(str(demo_tmpdir)) == [], "server processes left behind"
    # Each lifecycle line once: one per worker, saying which.
    said = (out.stdout + out.stderr).splitlines()
    stopping = [line[24:] for line in said if "stopping: no new reads" in line]
    assert len(stopping) == 2
    assert len(set(stopping)) == 2, stopping


def _row(table: str, label: str) -> str:
    line = next(line for line in table.splitlines() if label in line)
    return line.split("│")[2].strip()


@pytest.mark.parametrize(
    "when",
    ["outbox-dispatcher demo", "worker started"],
    ids=["servers up", "pipeline running"],
)
def test_demo_stopped_by_sigterm_cleans_up_like_ctrl_c(demo_tmpdir: Path, when: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": "postgresql://demo@127.0.0.1:1/nowhere",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "TMPDIR": str(demo_tmpdir),
        "PYTHONUNBUFFERED": "1",
    }
    log = demo_tmpdir.parent / f"{demo_tmpdir.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "demo", "--tasks", "1000000", "--seed", "7"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually_sync(lambda: when in log.read_text(), within=120)
        assert [p.name for p in demo_tmpdir.iterdir()] != []
        proc.send_signal(signal.SIGTERM)
        # The deadline is generous: a graceful stop of every part under a loaded machine.
        assert proc.wait(timeout=180) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        text = log.read_text()
        log.unlink()
    assert text.splitlines()[-1] == "dispatcher demo: interrupted"
    assert list(demo_tmpdir.iterdir()) == [], "temp dirs left behind"
    assert processes_mentioning(str(demo_tmpdir)) == [], "server processes left behind"
