"""What ships: the wheel built the way the images build it, run from a fresh venv.

Every other test imports the editable checkout, so a file the code loads at run
time (SQL, migrations) but the wheel leaves out goes unnoticed there. This one
copies what the Dockerfile's wheel stage copies into a temp dir, runs ``pip wheel --no-deps``
on it, installs the wheel into a new venv outside the checkout and drives
``dispatcher migrate``, ``enqueuer``, ``worker``, ``status`` and ``console`` from
that venv against the real servers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest
import redis as sync_redis

from dispatcher.demo.throwaway import free_port
from dispatcher.outbox.schema import available_migrations
from tests.data import insert_rows
from tests.dockerfile import build_sources
from tests.waiting import eventually_sync

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` dir of a fresh venv holding only the wheel and its dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    context = work / "context"
    context.mkdir()
    sources = build_sources()
    assert {"pyproject.toml", "dispatcher"} <= set(sources), sources
    for name in sources:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy(source, context / name)
    env = _clean_env()
    wheels = work / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        wheels,
        ".",
        cwd=context,
        env=env,
    )
    (wheel,) = wheels.glob("outbox_dispatcher-*.whl")
    target = work / "venv"
    venv.create(target, with_pip=True)
    _run(target / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=work, env=env)
    return target / "bin"


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would point Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def test_the_wheel_migrates_dispatches_and_reports(
    shipped: Path, empty_db_url: str, redis_url: str, queue: str, tmp_path: Path
) -> None:
    env = _clean_env(DATABASE_URL=empty_db_url, REDIS_URL=redis_url, STREAM_SHARDS="2")
    where = _run(
        shipped / "python",
        "-c",
        "import dispatcher; print(dispatcher.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert not Path(where.strip()).is_relative_to(ROOT), "imported the checkout, not the wheel"

    out = _run(shipped / "dispatcher", "migrate", cwd=tmp_path, env=env)
    latest = available_migrations()[-1].version
    assert f"migrate: {latest} applied, the schema is at version {latest}" in out
    insert_rows(empty_db_url, 25, queue=queue, shards=2)

    log = (tmp_path / "procs.log").open("w")
    procs = [
        subprocess.Popen(
            [shipped / "dispatcher", *args], cwd=tmp_path, env=env, stdout=log, stderr=log
        )
        for args in (
            ["enqueuer", "--poll-interval", "0.2"],
            ["worker", "--queue", queue, "--handler", "builtins:repr"],
        )
    ]
    redis = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    try:

        def handled() -> bool:
            with psycopg.connect(empty_db_url) as conn:
                left = conn.execute("SELECT count(*) FROM outbox").fetchone()
            streams = [f"workflow.tasks.{queue}.{n}" for n in range(2)]
            groups = [g for s in streams if redis.exists(s) for g in redis.xinfo_groups(s)]
            return (
                left == (0,)
                and len(groups) == 2
                and all(g["pending"] == 0 and g["entries-read"] for g in groups)
            )

        eventually_sync(handled, within=60, interval=0.1)
        status = json.loads(_run(shipped / "dispatcher", "status", "--json", cwd=tmp_path, env=env))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
        log.close()
        redis.close()
    assert codes == [0, 0], (tmp_path / "procs.log").read_text()
    assert status["outbox"]["PENDING"] == 0
    assert sum(s["length"] for s in status["streams"]) == 0, "handled entries are deleted"
    assert status["dlq"] == 0


def test_the_wheel_ships_one_package_and_no_test_tooling(shipped: Path) -> None:
    """The wheel installs one top-level name, ``dispatcher`` (the operator is
    ``dispatcher.controller``, with its vendored schemas); the tests' kit, the local cluster's
    tooling and the benchmarks stay in the checkout. The operator's command runs from it."""
    (wheel,) = (shipped.parents[1] / "wheels").glob("outbox_dispatcher-*.whl")
    with zipfile.ZipFile(wheel) as zipped:
        names = zipped.namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"dispatcher"}
    assert "dispatcher/controller/schemas/core-v1.json" in names
    test_like = [n for n in names if "_testing" in n or "/tests/" in n or "fix_" in n]
    assert test_like == []
    out = _run(shipped / "dispatcher", "operator", "--help", cwd=shipped, env=_clean_env())
    assert "--namespace" in out


def test_the_wheel_carries_and_serves_the_console_page(
    shipped: Path, outbox_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Every file of the console's page is in the wheel, and ``dispatcher console`` from the
    fresh venv serves them byte for byte (no build step, nothing fetched from elsewhere)."""
    static = ROOT / "dispatcher" / "console" / "static"
    names = sorted(p.name for p in static.iterdir())
    assert {"index.html", "console.js", "console.css"} <= set(names)
    (wheel,) = (shipped.parents[1] / "wheels").glob("outbox_dispatcher-*.whl")
    with zipfile.ZipFile(wheel) as zipped:
        inside = {n.removeprefix("dispatcher/console/static/") for n in zipped.namelist()}
    assert set(names) <= inside

    port = free_port()
    env = _clean_env(DATABASE_URL=outbox_db_url, REDIS_URL=redis_url)
    with (tmp_path / "console.log").open("w") as log:
        proc = subprocess.Popen(
            [shipped / "dispatcher", "console", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def fetched(path: str) -> bytes:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                return bytes(response.read())

        index = eventually_sync(
            lambda: fetched("/"), within=30, ignoring=(OSError,), what="the console up"
        )
        assert index == (static / "index.html").read_bytes()
        for name in names:
            assert fetched(f"/static/{name}") == (static / name).read_bytes(), name
        assert "http" not in (static / "index.html").read_text().replace(
            'xmlns="http://www.w3.org', ""
        ), "the page loads nothing from elsewhere"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, (tmp_path / "console.log").read_text()
