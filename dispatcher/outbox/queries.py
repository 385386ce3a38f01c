"""The outbox's SQL, loaded once from ``sql/queries.sql`` as named queries.

SQL is code: it lives in one versioned file, not in strings scattered
through loops. ``QUERIES["dlq_count"]`` is the text of ``-- name: dlq_count``.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType

__all__ = ["QUERIES", "parse_named_queries"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_named_queries(text: str) -> dict[str, str]:
    """Split a ``-- name: x`` annotated SQL file into ``{name: sql}``."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


QUERIES = MappingProxyType(
    parse_named_queries(resources.files(__package__).joinpath("sql/queries.sql").read_text())
)
