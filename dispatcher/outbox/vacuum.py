"""Keeps the outbox small when autovacuum does not.

Every dispatch inserts a row and deletes it, so the outbox makes dead tuples as
fast as it moves rows. The migrations tune autovacuum for that (vacuum after a
fixed number of dead tuples, unthrottled), but autovacuum can be off for the
whole server, or starved, and a queue table that is never vacuumed grows
without bound: its indexes fill with dead entries and every claim reads more of
them. So the enqueuer's maintenance checks the table too: when it holds more
than ``threshold`` dead tuples and nothing has vacuumed it for ``stale_after``
seconds, one enqueuer (an advisory lock) runs ``VACUUM (SKIP_LOCKED)`` on the
outbox and the batch journal. A role that does not own the table cannot; then
it says so once, at WARNING, with what to change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dispatcher.outbox.queries import QUERIES

__all__ = ["VACUUM_LOCK_KEY", "OutboxVacuum", "VacuumState", "needs_vacuum"]

log = logging.getLogger(__name__)

# Arbitrary constant shared by every version of this package: "vacuum" in ASCII.
VACUUM_LOCK_KEY = 0x766163_75756D


@dataclass(frozen=True, slots=True)
class VacuumState:
    dead_tuples: int
    since_vacuum: float | None  # seconds; None if nothing ever vacuumed the table
    may_vacuum: bool


def needs_vacuum(state: VacuumState, *, threshold: int, stale_after: float) -> bool:
    """Many dead tuples, and no vacuum (auto or manual) for a while: autovacuum is not coping."""
    if threshold <= 0 or state.dead_tuples < threshold:
        return False
    return state.since_vacuum is None or state.since_vacuum >= stale_after


class OutboxVacuum:
    """The maintenance step; ``run_once`` returns True when it vacuumed."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, threshold: int, stale_after: float = 60.0
    ) -> None:
        self._pool = pool
        self.threshold = threshold
        self.stale_after = stale_after
        self._warned = False

    async def run_once(self) -> bool:
        if self.threshold <= 0:
            return False
        async with self._pool.connection() as conn:
            cur = await conn.execute(QUERIES["vacuum_state"])
            row = await cur.fetchone()
            if row is None:  # no statistics yet
                return False
            state = VacuumState(int(row[0]), row[1], bool(row[2]))
            if not needs_vacuum(state, threshold=self.threshold, stale_after=self.stale_after):
                return False
            if not state.may_vacuum:
                self._warn_once(state)
                return False
            cur = await conn.execute(QUERIES["vacuum_lock"], {"key": VACUUM_LOCK_KEY})
            taken = await cur.fetchone()
            if not taken or not taken[0]:
                return False  # another enqueuer is at it
            try:
                await conn.execute(QUERIES["vacuum_outbox"], prepare=False)
            finally:
                await conn.execute(QUERIES["vacuum_unlock"], {"key": VACUUM_LOCK_KEY})
        log.info(
            "vacuumed the outbox (%d dead tuples, autovacuum had not for %s)",
            state.dead_tuples,
            "ever" if state.since_vacuum is None else f"{state.since_vacuum:.0f} s",
        )
        return True

    def _warn_once(self, state: VacuumState) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "the outbox holds %d dead tuples and nothing has vacuumed it; this role does "
                "not own the table and cannot: check that autovacuum is on, or run the "
                "enqueuer as the table's owner",
                state.dead_tuples,
            )
