"""The heartbeat of runs in progress: their leases renewed, their entries kept fresh.

One loop per worker, not one task per run. A run registers its attempt's
lease and its stream entry with ``hold`` and removes them with ``drop``
(``let_entry_go`` stops only the entry's freshness). On each beat the keeper:

- renews the leases not renewed (or taken) for a third of the lease TTL, so a
  lease is pushed a full TTL ahead at most half a TTL after it was last set;
- keeps fresh the entries not refreshed for a third of ``reclaim_idle``
  (``XCLAIM ... JUSTID`` to ourselves, one per stream): their idle time in
  the consumer group stays far below ``reclaim_idle``, so no reclaim loop,
  ours or another worker's, takes an entry whose handler is alive, and the
  delivery count does not move.

Short runs never cost a beat. A lease found to belong to someone else is no
longer renewed and its entry no longer kept fresh (the run goes on;
``dedup.py`` says what that risks); a Redis error is logged and retried on
the next beat.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from redis.exceptions import RedisError

from dispatcher.stream.consumer import RedisStreamConsumer
from dispatcher.worker.dedup import AttemptGuard

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Held:
    dedup_key: str
    consumer: RedisStreamConsumer | None  # None: the entry is no longer kept fresh
    entry_id: str
    renewed_at: float  # event-loop time the lease was last set
    fresh_at: float  # event-loop time the entry's idle time was last reset


class LeaseKeeper:
    """The leases and entries of the handler runs in progress, kept by ``run()``."""

    def __init__(self, guard: AttemptGuard, *, reclaim_idle: float) -> None:
        self._guard = guard
        self._lease_period = guard.lease_ttl_ms / 3000
        self._entry_period = reclaim_idle / 3
        self._held: dict[int, _Held] = {}
        self._handles = itertools.count()
        # The attempt whose async handler runs its first step inline now (``delivery.py``):
        # no keeper entry holds it, but a loop it blocks must not let its lease lapse.
        self.inline: str | None = None

    def __len__(self) -> int:
        return len(self._held)

    @property
    def guard(self) -> AttemptGuard:
        return self._guard

    def hold(
        self, dedup_key: str, consumer: RedisStreamConsumer | None = None, entry_id: str = ""
    ) -> int:
        """Start keeping the lease just taken for ``dedup_key`` (and the entry, if given)."""
        handle = next(self._handles)
        now = asyncio.get_running_loop().time()
        self._held[handle] = _Held(dedup_key, consumer, entry_id, now, now)
        return handle

    def dedup_keys(self) -> list[str]:
        """The attempts whose leases are kept now (the runs in progress), in the order taken."""
        # list() first: one step under the GIL, so another thread may read it (side_renewal.py)
        return list(dict.fromkeys(held.dedup_key for held in list(self._held.values())))

    def running_keys(self) -> list[str]:
        """``dedup_keys`` and the inline run's: every lease a blocked loop must keep (read
        from another thread: ``side_renewal.py``)."""
        inline = self.inline
        keys = self.dedup_keys()
        return keys if inline is None or inline in keys else [*keys, inline]

    def let_entry_go(self, handle: int) -> None:
        """Keep the lease but no longer the entry: it may be reclaimed after reclaim-idle."""
        if (held := self._held.get(handle)) is not None:
            held.consumer = None

    def drop(self, handle: int) -> None:
        self._held.pop(handle, None)

    async def run(self) -> None:
        """Renew due leases and refresh due entries until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self._lease_period, self._entry_period) / 2)
            await self.renew_due(now=loop.time())

    async def renew_due(self, *, now: float) -> None:
        """Renew the leases and refresh the entries due at ``now``, concurrently."""
        if not self._held:
            return
        leases = [
            (h, held)
            for h, held in self._held.items()
            if now - held.renewed_at >= self._lease_period
        ]
        streams: dict[str, tuple[RedisStreamConsumer, list[_Held]]] = {}
        for held in self._held.values():
            if held.consumer is not None and now - held.fresh_at >= self._entry_period:
                streams.setdefault(held.consumer.stream, (held.consumer, []))[1].append(held)
        await asyncio.gather(
            *(self._renew(h, held, now) for h, held in leases),
            *(self._refresh(consumer, found, now) for consumer, found in streams.values()),
        )

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

    async def _refresh(self, consumer: RedisStreamConsumer, found: list[_Held], now: float) -> None:
        try:
            await consumer.keep_fresh([held.entry_id for held in found])
        except (RedisError, OSError) as exc:
            log.warning("cannot keep entries fresh: %s", exc, extra={"stream": consumer.stream})
            return
        for held in found:
            held.fresh_at = now
