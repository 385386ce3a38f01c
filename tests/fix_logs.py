"""``printed``: what logging writes to stderr, configured as the CLI does (JSON, DEBUG)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from dispatcher.logs import configure_logging

__all__ = ["printed"]


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("DEBUG", "json")
    try:
        yield out
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
