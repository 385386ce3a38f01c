"""Test-suite wiring: fixtures live in the ``tests/fix_*.py`` plugin modules."""

pytest_plugins = [
    "tests.fix_db",
    "tests.fix_servers",
    "tests.fix_redis",
    "tests.fix_proxy",
    "tests.fix_pgbouncer",
    "tests.fix_cluster",
    "tests.fix_worker_process",
    "tests.fix_live_operator",
    "tests.fix_specfleet",
    "tests.fix_browser",
    "tests.fix_logs",
]


def pytest_unconfigure(config: object) -> None:
    """Stop the suite's own PostgreSQL and Redis (``tests.suite_servers``), if it started them."""
    from tests.suite_servers import stop_all

    stop_all()
