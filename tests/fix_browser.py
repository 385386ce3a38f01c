"""The console's browser tests: Debian's headless Chromium (Selenium) and consoles to drive.

``chrome`` is one headless Chromium (``tests.chromium``: Debian's,
never a downloaded one) for the session, its cookies cleared for each test.
``console`` starts ``dispatcher console`` as a process on a free port against
the test's PostgreSQL and Redis (``console(token="t")``) and stops it after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher.demo.throwaway import free_port
from tests.chromium import BrowserMissing, chromium
from tests.waiting import eventually_sync

ROOT = Path(__file__).resolve().parents[1]
# Where the console tests save their screenshots: a temporary folder, so a test run leaves
# the checkout as it was; `make screenshots` points it at docs/images to renew the docs' ones.
SCREENSHOTS = Path(
    os.environ.get("CONSOLE_SCREENSHOTS")
    or Path(tempfile.gettempdir()) / "outbox-dispatcher-console-screenshots"
)


@pytest.fixture(scope="session")
def _chrome_session() -> Iterator[Any]:
    try:
        with chromium() as driver:
            yield driver
    except BrowserMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture
def chrome(_chrome_session: Any) -> Any:
    _chrome_session.delete_all_cookies()
    return _chrome_session


@dataclass
class ConsoleProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A request as a script (not the page) would send it: status and JSON body."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def console(
    outbox_db_url: str, redis_url: str, tmp_path: Path
) -> Iterator[Callable[..., ConsoleProcess]]:
    started: list[ConsoleProcess] = []

    def start(*, token: str | None = None) -> ConsoleProcess:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "DISPATCHER_CONSOLE_TOKEN"}
        if token is not None:
            env["DISPATCHER_CONSOLE_TOKEN"] = token
        log = tmp_path / f"console-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    *("-m", "dispatcher.cli", "console", "--port", str(port)),
                    *("--database-url", outbox_db_url, "--redis-url", redis_url),
                    *("--refresh", "0.5", "--discover-every", "1", "--shards", "2"),
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        console = ConsoleProcess(f"http://127.0.0.1:{port}", proc, log)
        started.append(console)

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return console.api("/api/overview")[0] == 200
            except OSError:
                return False

        eventually_sync(up, within=30, what="the console answering")
        return console

    yield start
    for c in started:
        c.proc.send_signal(signal.SIGTERM)
        try:
            assert c.proc.wait(timeout=15) == 0, c.log.read_text()
        finally:
            if c.proc.poll() is None:
                c.proc.kill()
