"""The ``dispatcher`` command run as a subprocess of the test's interpreter."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["cli"]


def cli(*args: str, db_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            *("-m", "dispatcher.cli"),
            *args,
            *("--database-url", db_url, "--redis-url", redis_url),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
