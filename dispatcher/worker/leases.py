"""Lease renewal for long handler runs: one loop per worker, not one task per run.

A run registers its attempt's lease with ``hold`` and removes it with
``drop``. The keeper wakes every sixth of the lease TTL and renews only the
leases not renewed (or taken) for a third of the TTL, so short runs never
cost a renewal and a lease is pushed a full TTL ahead at most half a TTL
after it was last set. A lease found to belong to someone else is no longer
renewed (the run goes on; ``dedup.py`` says what that risks); a Redis error
is logged and retried on the next wake-up.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.worker.dedup import AttemptGuard

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Held:
    dedup_key: str
    renewed_at: float  # event-loop time the lease was last set


class LeaseKeeper:
    """The leases of the handler runs in progress, renewed by ``run()``."""

    def __init__(self, guard: AttemptGuard) -> None:
        self._guard = guard
        self._period = guard.lease_ttl_ms / 3000
        self._held: dict[int, _Held] = {}
        self._handles = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, dedup_key: str) -> int:
        """Start keeping the lease just taken for ``dedup_key``; the handle is for ``drop``."""
        handle = next(self._handles)
        self._held[handle] = _Held(dedup_key, asyncio.get_running_loop().time())
        return handle

    def drop(self, handle: int) -> None:
        self._held.pop(handle, None)

    async def run(self) -> None:
        """Renew due leases until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._period / 2)
            await self.renew_due(now=loop.time())

    async def renew_due(self, *, now: float) -> None:
        """Renew every lease last set at least a third of the TTL before ``now``."""
        due = {h: held for h, held in self._held.items() if now - held.renewed_at >= self._period}
        if due:
            await asyncio.gather(*(self._renew(h, held, now) for h, held in due.items()))

    async def _renew(self, handle: int, held: _Held, now: float) -> None:
        try:
            kept = await self._guard.renew(held.dedup_key)
        except (RedisError, OSError) as exc:
            log.warning("cannot renew lease: %s", exc, extra={"dedup_key": held.dedup_key})
            return
        if kept:
            held.renewed_at = now
            return
        log.warning(
            "lease lost while the handler runs; another worker may run it too",
            extra={"dedup_key": held.dedup_key},
        )
        self.drop(handle)
