"""The throwaway servers say why they did not come up (their output, not only a timeout)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from dispatcher.demo.throwaway import PostgresProcess, RedisProcess, ServerUnavailable


def test_a_redis_that_does_not_start_shows_what_it_printed(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis", "--no-such-directive", "yes")
    with pytest.raises(ServerUnavailable, match="no-such-directive"):
        server.start()
    server.kill()


def test_a_postgres_that_does_not_start_shows_its_log() -> None:
    # Not under pytest's temp root: as root the server runs as the postgres OS user.
    workdir = Path(tempfile.mkdtemp(prefix="od-pg-fails-"))
    server = PostgresProcess(workdir, "no_such_setting = 1")
    try:
        with pytest.raises(ServerUnavailable, match="no_such_setting"):
            server.start()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
