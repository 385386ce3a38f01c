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
* while the flag cannot be taken because a transaction that inserted an
  outbox row is still open and holds it shared (possibly for a long time), no
  commit NOTIFYs, so claims keep coming every few milliseconds; they back off
  towards the poll interval only after finding nothing for
  ``blocked_backoff_after`` seconds;
* while another enqueuer holds it (``elsewhere``), that one claims what
  commits when notified: this one stands by, claiming once a poll interval (a
  holder that stopped working without losing its session must not stall
  dispatch) and trying the flag again after.
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

from dispatcher.outbox.metrics import EnqueuerMetrics
from dispatcher.outbox.queries import QUERIES

__all__ = ["IDLE_FLAG_KEY", "IdleDecider", "IdleFlag", "IdlePolicy", "Step"]

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


@dataclass(frozen=True, slots=True)
class Step:
    """What to do after a claim: drop the flag, try to take it, then claim in ``delay`` s."""

    drop: bool = False
    take: bool = False
    delay: float | None = None  # None: until a wake-up (NOTIFY, the poll)


class IdleDecider:
    """The flag's decisions, pure: claim results in, ``Step`` out (times on one clock)."""

    def __init__(self, policy: IdlePolicy, now: float) -> None:
        self.policy = policy
        self._quiet_since: float | None = None  # end of the first empty claim in a row
        self._last_found = now
        self._blocked_delay = policy.blocked_claim_every

    def on_claim(
        self,
        *,
        count: int,
        started: float,
        ended: float,
        full: bool,
        held: bool,
        listening: bool,
        elsewhere: bool = False,
    ) -> Step:
        policy = self.policy
        if elsewhere and not held and not full:
            return Step(take=True)  # standing by: one claim a poll, then try the flag again
        if count:
            self._quiet_since = None
            self._last_found = ended
            self._blocked_delay = policy.blocked_claim_every
            drop = held and count >= policy.busy_at_rows
            if full:
                return Step(drop=drop, delay=0.0)
            return Step(drop=drop, delay=None if held and not drop else policy.linger)
        if held or not listening:
            return Step()  # a NOTIFY (or the poll) wakes the enqueuer
        quiet_since = self._quiet_since
        if quiet_since is None or started < quiet_since + policy.idle_confirm_after:
            if quiet_since is None:
                self._quiet_since = ended
            return Step(delay=policy.idle_confirm_after)
        return Step(take=True)

    def on_take(self, *, taken: bool, ended: float, elsewhere: bool = False) -> float:
        """Seconds until the next claim after trying to take the flag."""
        policy = self.policy
        if elsewhere:
            # Its holder claims what commits when notified: this one's claims would only
            # find nothing, or take rows from under it, at the cost of a round trip each.
            return policy.max_delay
        if taken:
            self._blocked_delay = policy.blocked_claim_every
            # Rows committed before the flag was taken sent no NOTIFY, but their transactions
            # have ended (they held the flag's lock shared): one claim now sees them all.
            return 0.0
        delay = self._blocked_delay
        if ended - self._last_found > policy.blocked_backoff_after:
            self._blocked_delay = min(delay * 2, policy.max_delay)
        return delay


class IdleFlag:
    """The flag on its own session, and when to claim next (``after_claim``)."""

    def __init__(
        self,
        *,
        conninfo: str,
        connect_kwargs: dict[str, Any],
        metrics: EnqueuerMetrics,
        policy: IdlePolicy = IdlePolicy(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._metrics = metrics
        self._conninfo = conninfo
        self._kwargs = connect_kwargs
        self._session: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._decider = IdleDecider(policy, clock())
        self.held = False  # False again whenever the session is lost
        # Another enqueuer holds the flag, as far as this one knows: it stands by.
        self.elsewhere = False

    async def after_claim(
        self,
        *,
        count: int,
        started: float,
        ended: float,
        full: bool,
        can_listen: bool,
    ) -> float | None:
        """Act on one claim's result; seconds until the next claim (None: await a wake-up).

        ``started``/``ended`` are the claim's times on the ``clock``.
        """
        async with self._lock:
            if full:
                self.elsewhere = False  # a backlog: every enqueuer drains it
            step = self._decider.on_claim(
                count=count,
                started=started,
                ended=ended,
                full=full,
                held=self.held,
                listening=can_listen,
                elsewhere=self.elsewhere,
            )
            if step.drop:
                await self._drop()
            if not step.take:
                return step.delay
            taken = await self._take()
            if taken:
                self._metrics.idle_flag_taken.inc()
            return self._decider.on_take(taken=taken, ended=ended, elsewhere=self.elsewhere)

    async def look(self) -> None:
        """Whether another enqueuer holds the flag, before this one's first claim."""
        async with self._lock:
            if not self.held:
                row = await self._run("idle_elsewhere", {"key": IDLE_FLAG_KEY})
                self.elsewhere = bool(row and row[0])

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
            self.elsewhere = bool(row and row[1])
        return self.held

    async def _drop(self) -> None:
        self.elsewhere = False
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
