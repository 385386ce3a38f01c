"""Redis persistence watched while the enqueuer runs, not only at its start.

A Redis restarted, or reconfigured, without AOF loses every stream it holds at its next
restart: the tasks published and not yet handled vanish, and the outbox no longer has
them. The start-up check (``check_persistence``) cannot see that happen later, so the
enqueuer reads ``INFO persistence`` again every ``check_every`` seconds. When AOF turns
off it says so once (an ERROR); with ``--require-aof`` it also claims nothing from then on:
rows stay PENDING in the outbox, where they survive, until AOF is back (an INFO says
so). A reading that fails changes nothing (publishing fails on its own if Redis is gone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient, aof_enabled

__all__ = ["AofWatch"]

log = logging.getLogger(__name__)


class AofWatch:
    """Whether Redis runs with AOF, read at most every ``check_every`` seconds."""

    def __init__(
        self,
        client: RedisClient,
        *,
        require: bool,
        check_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.require = require
        self._check_every = check_every
        self._clock = clock
        self.durable: bool | None = None  # None: not read yet, or unreadable so far
        self._read_at: float | None = None

    @property
    def holding(self) -> bool:
        """Claims are held: ``--require-aof`` and Redis runs without AOF."""
        return self.require and self.durable is False

    def open_now(self) -> bool:
        """True when a batch may be claimed now without reading Redis first."""
        return not self._due() and not self.holding

    async def allows(self) -> bool:
        """True when a batch may be claimed now."""
        if self._due():
            await self._read()
        return not self.holding

    def _due(self) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= self._check_every

    async def _read(self) -> None:
        self._read_at = self._clock()
        try:
            durable = await aof_enabled(self._client)
        except (RedisError, OSError) as exc:
            log.debug("could not read INFO persistence: %s", exc)
            return
        before, self.durable = self.durable, durable
        if durable == before or (before is None and durable):
            return
        if not durable:
            log.error(
                "Redis runs without AOF now (appendonly no): the tasks in its streams are lost "
                "when it restarts; %s",
                "publishing stopped (--require-aof), rows stay PENDING in the outbox until it "
                "runs with appendonly yes again"
                if self.require
                else "set appendonly yes (--require-aof stops publishing meanwhile)",
            )
        else:
            log.info("Redis runs with AOF again%s", "; publishing" if self.require else "")
