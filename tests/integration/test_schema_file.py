"""The schema file is what the migrations produce (read it, not the migrations in order)."""

from __future__ import annotations

from tests.schema_file import SCHEMA_FILE, dump


def test_the_schema_file_is_what_the_migrations_produce(outbox_db_url: str) -> None:
    assert dump(outbox_db_url) == SCHEMA_FILE.read_text(), "run python -m tests.schema_file --write"
