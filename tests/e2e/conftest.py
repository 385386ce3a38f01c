"""The e2e tests that start clusters of their own run before any test uses the session's
``cluster`` (one node runs on a machine at a time, and that one starts lazily at its first use
and runs to the session's end)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("own_cluster") is None)
