"""The idle flag: whether outbox inserts NOTIFY, and when to claim again when nobody hears them.

NOTIFY is not free: it serialises the commits of every transaction that sends
it. So the trigger notifies only while some enqueuer holds the idle flag, an
exclusive advisory lock on that enqueuer's own session (the trigger's WHEN
clause tries to take it shared). This unit owns that session, the lock, and
the decisions around it, made after every claim:

* a claim that finds several rows drops the flag (commits arrive faster than
  an enqueuer wakes: notifications would only slow them down); while claims
  come back partial the next one follows after ``linger``, so a steady stream
  of commits goes out a batch at a time;
* two empty claims a few milliseconds apart take the flag again, and one more
  claim follows at once: every transaction that inserted without a NOTIFY held
  the flag's lock shared until it ended, so that claim sees its rows;
* while the flag cannot be taken (another enqueuer holds it, or a transaction
  that inserted an outbox row is still open and holds it shared, possibly for
  a long time) no commit NOTIFYs, so claims keep coming every few
  milliseconds; they back off towards the poll interval only after finding
  nothing for ``blocked_backoff_after`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from dispatcher.outbox import metrics
from dispatcher.outbox.queries import QUERIES

__all__ = ["IDLE_FLAG_KEY", "IdleFlag", "IdlePolicy"]

# The advisory lock key of the idle flag; migration 0005's trigger tests the same number.
IDLE_FLAG_KEY = 0x6F626964_6C65  # "obidle"


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    # Drop the flag when one claim finds at least this many rows.
    busy_at_rows: int = 2
    # An empty claim is confirmed by a second one, started at least this many seconds after
    # the first ended, before taking the flag (concurrent empty claims do not confirm each
    # other).
    idle_confirm_after: float = 0.005
    # A claim that found rows but not a full batch, with the flag not held: wait this long
    # before the next claim, so rows arriving at a steady rate go out in batches (a few rows
    # per transaction would spend the database's CPU on the enqueuer instead of the
    # application).
    linger: float = 0.002
    # While the flag cannot be taken, claim this often...
    blocked_claim_every: float = 0.005
    # ...until claims have found nothing for this long; then back off, doubling up to
    # ``max_delay`` (the poll interval).
    blocked_backoff_after: float = 2.0
    max_delay: float = 1.0


class IdleFlag:
    """The flag on its own session, and when to claim next (``after_claim``)."""

    def __init__(
        self,
        *,
        conninfo: str,
        connect_kwargs: dict[str, Any],
        policy: IdlePolicy = IdlePolicy(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._conninfo = conninfo
        self._kwargs = connect_kwargs
        self._clock = clock
        self._session: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.held = False  # False again whenever the session is lost
        self._quiet_since: float | None = None  # end of the first empty claim in a row
        self._last_found = clock()
        self._blocked_delay = policy.blocked_claim_every

    async def after_claim(
        self, *, count: int, started: float, ended: float, full: bool, can_listen: bool
    ) -> float | None:
        """Act on one claim's result; seconds until the next claim (None: await a wake-up).

        ``started``/``ended`` are the claim's times on the ``clock``.
        """
        policy = self.policy
        async with self._lock:
            if count:
                self._quiet_since = None
                self._last_found = ended
                self._blocked_delay = policy.blocked_claim_every
                if self.held and count >= policy.busy_at_rows:
                    await self._drop()
                if full:
                    return 0.0
                return None if self.held else policy.linger
            if self.held or not can_listen:
                return None  # a NOTIFY (or the poll) wakes the enqueuer
            return await self._confirm_idle(started, ended)

    async def _confirm_idle(self, started: float, ended: float) -> float:
        policy = self.policy
        quiet_since = self._quiet_since
        if quiet_since is None or started < quiet_since + policy.idle_confirm_after:
            if quiet_since is None:
                self._quiet_since = ended
            return policy.idle_confirm_after
        if await self._take():
            metrics.IDLE_ANNOUNCED.inc()
            self._blocked_delay = policy.blocked_claim_every
            # Rows committed before the flag was taken sent no NOTIFY, but their transactions
            # have ended (they held the flag's lock shared): one claim now sees them all.
            return 0.0
        delay = self._blocked_delay
        if ended - self._last_found > policy.blocked_backoff_after:
            self._blocked_delay = min(delay * 2, policy.max_delay)
        return delay

    async def check(self) -> bool:
        """Whether the flag is still held: a session that died took it along."""
        async with self._lock:
            if self.held:
                with contextlib.suppress(psycopg.OperationalError):  # the flag is then gone
                    await self._run("ping")
            return self.held

    async def drop(self) -> None:
        async with self._lock:
            await self._drop()

    async def aclose(self) -> None:
        """Close the session, which drops the flag."""
        async with self._lock:
            self.held = False
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def _take(self) -> bool:
        if not self.held:
            row = await self._run("take_idle_flag", {"key": IDLE_FLAG_KEY})
            self.held = bool(row and row[0])
        return self.held

    async def _drop(self) -> None:
        if self.held:
            self.held = False
            await self._run("drop_idle_flag")

    async def _run(self, name: str, params: dict[str, Any] | None = None) -> Any:
        if self._session is None or self._session.closed:
            self.held = False  # it died with the old session
            self._session = await AsyncConnection.connect(self._conninfo, **self._kwargs)
        try:
            cur = await self._session.execute(QUERIES[name], params or {})
            return await cur.fetchone() if cur.description else None
        except psycopg.OperationalError:
            self.held = False
            await self._session.close()  # reconnect next time
            raise
