"""``dispatcher/outbox/sql/schema.sql``: what every migration together produces, to read at once.

``python -m tests.schema_file --write`` migrates a new database on the suite's
PostgreSQL and writes its ``pg_dump --schema-only``, without the lines that say
nothing about the schema (comments, ``SET``s, blank runs); the test in
``tests/integration/test_schema_file.py`` fails while the file differs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg

from dispatcher.demo.throwaway import postgres_bin_dir

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "dispatcher" / "outbox" / "sql" / "schema.sql"
HEADER = (
    "-- The outbox schema as every migration together leaves it (generated: "
    "python -m tests.schema_file --write).\n"
    "-- Read-only: change the schema with a new migration in migrations/.\n"
)


def dump(url: str) -> str:
    """The schema of the database at ``url``, as the schema file holds it."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    done = subprocess.run(
        [
            str(postgres_bin_dir() / "pg_dump"),
            *("--schema-only", "--no-owner", "--no-privileges", "--no-comments"),
            *("-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432))),
            *("-U", str(params.get("user", "postgres")), str(params["dbname"])),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    kept = [
        line
        for line in done.stdout.splitlines()
        if not line.startswith(("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict"))
        and not line.startswith("\\unrestrict")
    ]
    return HEADER + re.sub(r"\n{3,}", "\n\n", "\n".join(kept).strip() + "\n")


if __name__ == "__main__":
    from tests.fix_db import _create_database, _drop_database, migrate_url

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.schema_file --write")
    url = _create_database("schema_file")
    try:
        migrate_url(url)
        SCHEMA_FILE.write_text(dump(url))
    finally:
        _drop_database(url)
