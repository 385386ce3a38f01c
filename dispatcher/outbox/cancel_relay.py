"""The enqueuer's side of cancelling a run: committed cancels relayed to Redis.

``cancel_run`` leaves a row in ``outbox_cancel`` in the application's
transaction; its commit NOTIFYs ``outbox_cancel`` (the empty payload, a hint:
anyone may NOTIFY a channel). This loop answers a hint, and polls anyway
every ``poll_interval``: in one short transaction it locks the oldest
committed cancels (``SKIP LOCKED``: enqueuers share them), records them in
Redis (``dispatcher.stream.cancel_keys``: kept for ``ttl_ms``, the workers'
dedup window, then the signal the workers block on) and deletes them. A
failure rolls that back: the cancels stay and are relayed on the next turn,
so a cancel is recorded at least once (twice is harmless: the same member,
its window started again). Nothing in a notification is read, and no failure
ends the loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool
from redis.exceptions import RedisError

from dispatcher.observability import PrefixedMetrics
from dispatcher.outage import Outage
from dispatcher.outbox.enqueuer_config import EnqueuerConfig
from dispatcher.outbox.listener import OutboxListener
from dispatcher.outbox.loop_signals import LoopSignals
from dispatcher.outbox.queries import QUERIES
from dispatcher.redis_client import RedisClient
from dispatcher.stream.cancel_keys import record_cancels

__all__ = ["CANCEL_CHANNEL", "CancelRelay"]

CANCEL_CHANNEL = "outbox_cancel"
# Cancels relayed per transaction; a full one is followed by the next at once.
BATCH = 500

log = logging.getLogger(__name__)


class _EveryNotification:
    """On the cancel channel every notification is a hint, whatever it holds: the relay
    reads the committed cancels from the table."""

    def __init__(self, signals: LoopSignals) -> None:
        self._signals = signals

    def receive(self, payload: str) -> None:
        self._signals.ring()


class CancelRelay:
    """Turns committed cancels into Redis records until cancelled."""

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        client: RedisClient,
        config: EnqueuerConfig,
        registry: CollectorRegistry,
        outage: Outage,
        listen_conninfo: str | None = None,
    ) -> None:
        self._pool = pool
        self._client = client
        self._outage = outage  # the enqueuer's: where Redis being down is said
        # A cancel is kept as long as a task of the run could still arrive as a duplicate.
        self._ttl_ms = int(config.dedup_window * 1000)
        self._poll_interval = config.poll_interval
        self._publish_timeout = config.publish_timeout
        self.signals = LoopSignals()  # rung by its listener
        self.relayed = PrefixedMetrics(registry, prefix="dispatcher_outbox_").counter(
            "cancels_relayed", "Cancelled runs recorded in Redis for the workers"
        )
        self.listener = (
            OutboxListener(
                conninfo=listen_conninfo,
                hints=_EveryNotification(self.signals),
                signals=self.signals,
                channel=CANCEL_CHANNEL,
                application_name="outbox-dispatcher-cancel-listener",
            )
            if listen_conninfo
            else None
        )

    async def run(self) -> None:
        """Relay until cancelled."""
        listening = asyncio.create_task(self.listener.run()) if self.listener else None
        try:
            while True:
                if await self._relay_quietly() >= BATCH:
                    continue
                await self.signals.wait(self._poll_interval)
        finally:
            if listening is not None:
                listening.cancel()
                await asyncio.gather(listening, return_exceptions=True)

    async def _relay_quietly(self) -> int:
        try:
            return await self.relay_once()
        except (RedisError, OSError) as exc:
            if not self._outage.failed(exc, what="recording cancelled runs"):
                log.warning("could not record cancelled runs in Redis (retried): %s", exc)
        except Exception as exc:
            log.warning("could not relay cancelled runs (retried): %s", exc)
        return 0

    async def relay_once(self) -> int:
        """Relay one batch of committed cancels; how many."""
        async with self._pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(row_factory=tuple_row)
            await cursor.execute(QUERIES["take_cancels"], {"limit": BATCH})
            run_ids = [str(row[0]) for row in await cursor.fetchall()]
            async with asyncio.timeout(self._publish_timeout):  # the transaction stays short
                await record_cancels(self._client, run_ids, ttl_ms=self._ttl_ms)
        if run_ids:
            self.relayed.inc(len(run_ids))
            log.info("recorded %d cancelled runs for the workers", len(run_ids))
        return len(run_ids)
