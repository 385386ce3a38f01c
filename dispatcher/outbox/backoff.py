"""How long a row waits before its next publish attempt: pure, no I/O.

``retry_delay`` is exponential backoff with full jitter and a floor of the
base delay, so enqueuers recovering from a Redis outage spread their retries
instead of hammering it at the same instant. What to do with each row of a
batch is decided in ``outcomes``.
"""

from __future__ import annotations

import random

__all__ = ["retry_delay"]

DEFAULT_BACKOFF_SECONDS = 5
MAX_DELAY_SECONDS = 3600.0


def retry_delay(base_seconds: int, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before retry ``attempt`` (1-based): uniform in [base, base + base*2^(attempt-1)]."""
    base = base_seconds if base_seconds > 0 else DEFAULT_BACKOFF_SECONDS
    exp = base * 2.0 ** max(attempt - 1, 0)
    return min(base + (rng or random).random() * exp, MAX_DELAY_SECONDS)
