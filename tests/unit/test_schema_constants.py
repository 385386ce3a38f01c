"""The numbers the schema holds are the code's: each is written once in Python and once in a
migration (history, never edited), and these tie the two together.

``schema.sql`` is what the migrations produce (``test_schema_file`` checks it against a
migrated database), so reading it here reads the migrations' result.
"""

from __future__ import annotations

import re

from dispatcher.outbox.backoff import DEFAULT_BACKOFF_SECONDS, DEFAULT_MAX_RETRIES
from dispatcher.outbox.idle_flag import IDLE_FLAG_KEY
from dispatcher.stream.naming import TASK_STREAM_PATTERN
from tests.schema_file import SCHEMA_FILE


def _column_default(table: str, column: str) -> int:
    schema = SCHEMA_FILE.read_text()
    body = re.search(rf"CREATE TABLE public\.{table} \((.*?)\n\)", schema, re.DOTALL)
    assert body is not None, f"no table {table} in schema.sql"
    found = re.search(rf"^\s+{column} integer DEFAULT (\d+) NOT NULL", body.group(1), re.M)
    assert found is not None, f"{table}.{column} has no integer default"
    return int(found.group(1))


def test_the_trigger_tests_the_idle_flag_the_enqueuer_takes() -> None:
    keys = re.findall(r"pg_try_advisory_xact_lock_shared\('?(\d+)'?", SCHEMA_FILE.read_text())
    assert keys == [str(IDLE_FLAG_KEY)]


def test_the_tables_default_retries_and_backoff_are_the_enqueuers() -> None:
    for table in ("outbox", "outbox_dlq"):
        assert _column_default(table, "max_retries") == DEFAULT_MAX_RETRIES
        assert _column_default(table, "backoff_seconds") == DEFAULT_BACKOFF_SECONDS


def test_the_tables_stream_check_is_the_enqueuers_pattern() -> None:
    checks = re.findall(r"CHECK \(\(stream ~ '(.*?)'::text\)\)", SCHEMA_FILE.read_text())
    assert checks == [f"^{TASK_STREAM_PATTERN}$"]
