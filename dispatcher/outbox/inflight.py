"""Which rows this process is publishing, and by which path: each row goes out once.

An idle enqueuer publishes rows from their notifications without locking them
(``NotifiedRows``) while its claim batches lock rows in the database. Both can
meet the same row: a claim running when a row commits locks it while its
notification is on the way. Both paths register here, in the one event loop,
before publishing, so whichever registers a row first publishes it and the
other leaves it alone:

* a claim that meets rows being published from notifications lets go of
  all its rows untouched (their delete waits for the claim's transaction to
  end, then removes them; the next claim takes the others);
* a notification is dropped for rows a claim holds, or took lately (a claim
  can lock, publish and delete a row before its notification is read).

A notified row stays registered until its delete commits, so no claim of
this process can lock it between its XADD and its delete. The listener's
thread registers the rows it publishes itself (``NotifiedRows.publish_now``),
so each check-and-register holds a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

__all__ = ["InFlight"]


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_HasId)


class InFlight:
    """Rows held by claims and rows out from notifications, in one process."""

    def __init__(self, *, remember: int = 10_000) -> None:
        self._claimed: set[str] = set()
        self._notified: set[str] = set()
        # Ids claims took lately, in two generations: the newest, and the one before it.
        # When the newest holds ``remember`` ids it becomes the one before: at least the
        # last ``remember`` ids are kept (enough for a notification's lag), at most about
        # twice that, with a set update per claim rather than an insert and evict per id.
        self._taken: set[str] = set()
        self._taken_before: set[str] = set()
        self._remember = remember
        self._lock = threading.Lock()  # the listener's thread registers rows too

    def claim(self, ids: Sequence[str]) -> bool:
        """Register a claim's rows, unless some are out from notifications (then False)."""
        with self._lock:
            if self._notified and not self._notified.isdisjoint(ids):
                return False
            self._taken.update(ids)
            if len(self._taken) >= self._remember:
                self._taken_before, self._taken = self._taken, set()
            self._claimed.update(ids)
            return True

    def unclaim(self, ids: Iterable[str]) -> None:
        """The claim's transaction has ended."""
        with self._lock:
            self._claimed.difference_update(ids)

    def notify(self, rows: Sequence[R]) -> list[R]:
        """Register notified rows; return those to publish (no claim holds or took them)."""
        with self._lock:
            fresh = [
                r
                for r in dict((r.id, r) for r in rows).values()
                if r.id not in self._claimed
                and r.id not in self._taken
                and r.id not in self._taken_before
                and r.id not in self._notified
            ]
            self._notified.update(r.id for r in fresh)
            return fresh

    def release(self, ids: Iterable[str]) -> None:
        """Notified rows deleted (or handed to the claim path): claims may take them again."""
        with self._lock:
            self._notified.difference_update(ids)

    @property
    def notified(self) -> frozenset[str]:
        return frozenset(self._notified)
