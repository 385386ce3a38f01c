"""PostgreSQL fixtures: a fresh database per test module on the machine's server."""

from __future__ import annotations
