"""A one-shot command that fails says so in one line: what failed, its cause, the setting.

The traceback only at ``--log-level DEBUG``; never the connection string.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dispatcher.demo.throwaway import free_port


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_status_with_postgresql_down_is_one_line_with_the_cause(redis_url: str) -> None:
    port = free_port()

    out = cli(
        "status", "--database-url", f"postgresql://u@127.0.0.1:{port}/x", "--redis-url", redis_url
    )

    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "dispatcher status: cannot reach PostgreSQL (check DATABASE_URL / --database-url): "
        f'connection failed: connection to server at "127.0.0.1", port {port} failed: '
        "Connection refused"
    ]


def test_status_with_redis_down_is_one_line_naming_redis_url(outbox_db_url: str) -> None:
    port = free_port()

    out = cli(
        "status", "--database-url", outbox_db_url, "--redis-url", f"redis://127.0.0.1:{port}/0"
    )

    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "dispatcher status: cannot reach Redis (check REDIS_URL / --redis-url): "
        f"Error 111 connecting to 127.0.0.1:{port}. Connect call failed ('127.0.0.1', {port})."
    ]


def test_status_with_a_malformed_database_url_names_it_without_echoing_it() -> None:
    out = cli("status", "--database-url", "host=db password=s3cret dbname")

    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "dispatcher status: DATABASE_URL (or --database-url) is not a PostgreSQL URL or "
        "connection string (postgresql://USER:PASSWORD@HOST:PORT/DB)"
    ]


def broken_handler(tmp_path: Path) -> None:
    (tmp_path / "broken_handler.py").write_text("x = 1\nraise RuntimeError('boom at import')\n")


def test_a_handler_that_raises_at_import_is_one_line_at_info(tmp_path: Path) -> None:
    broken_handler(tmp_path)

    out = cli("worker", "--queue", "q", "--handler", "broken_handler:handle", cwd=tmp_path)

    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "dispatcher worker: cannot import handler module 'broken_handler': "
        "RuntimeError: boom at import"
    ]


def test_a_handler_that_raises_at_import_shows_its_traceback_at_debug(tmp_path: Path) -> None:
    broken_handler(tmp_path)

    out = cli(
        "worker",
        "--queue",
        "q",
        "--handler",
        "broken_handler:handle",
        "--log-level",
        "DEBUG",
        cwd=tmp_path,
    )

    assert out.returncode == 2
    assert f'File "{tmp_path / "broken_handler.py"}", line 2, in <module>' in out.stderr
    assert out.stderr.splitlines()[-1] == (
        "dispatcher worker: cannot import handler module 'broken_handler': "
        "RuntimeError: boom at import"
    )


def test_demo_without_the_demo_extra_says_how_to_install_it() -> None:
    # `rich` absent, as in an install without the extra: None in sys.modules fails its import.
    code = (
        "import sys; sys.modules['rich'] = None; "
        "from dispatcher.cli.main import main; sys.exit(main(['demo']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "dispatcher demo needs the demo extra: pip install 'outbox-dispatcher[demo]'"
    ]
