"""How long a row waits before its next publish attempt, and how many it gets: pure, no I/O.

``retry_delay`` is exponential backoff with full jitter and a floor of the
base delay, so enqueuers recovering from a Redis outage spread their retries
instead of hammering it at the same instant. What to do with each row of a
batch is decided in ``outcomes``. The defaults here are the only ones: the
application API, the outcomes and the recovery's SQL (``RECOVERY_PARAMS``,
which computes the same backoff for rows it charges) read them; the outbox
table's column defaults are checked against them by a test.
"""

from __future__ import annotations

import random

__all__ = [
    "DEFAULT_BACKOFF_SECONDS",
    "DEFAULT_MAX_RETRIES",
    "MAX_DELAY_SECONDS",
    "RECOVERY_PARAMS",
    "retry_delay",
]

# A row's retry budget and backoff base when it does not set its own (0 or less).
DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF_SECONDS = 5
MAX_DELAY_SECONDS = 3600.0

# The same, for the recovery's SQL (``recover_batches`` in queries.sql).
RECOVERY_PARAMS = {
    "default_max_retries": DEFAULT_MAX_RETRIES,
    "default_backoff": DEFAULT_BACKOFF_SECONDS,
    "max_delay": MAX_DELAY_SECONDS,
}


def retry_delay(base_seconds: int, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before retry ``attempt`` (1-based): uniform in [base, base + base*2^(attempt-1)]."""
    base = base_seconds if base_seconds > 0 else DEFAULT_BACKOFF_SECONDS
    exp = base * 2.0 ** max(attempt - 1, 0)
    return min(base + (rng or random).random() * exp, MAX_DELAY_SECONDS)
