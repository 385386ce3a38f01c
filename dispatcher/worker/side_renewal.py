"""The leases of runs in progress, renewed from a thread while the event loop is blocked.

Leases are renewed on the event loop (``leases.py``), and async handlers run on it. An
async handler that blocks the loop (``time.sleep``, a blocking client, long CPU work)
would stop every renewal: past the lease TTL another worker would start the same attempt
beside it. So while the loop does not answer, the loop's watch (``stalls.py``) renews the
leases held from its own thread, on an event loop and a Redis connection of its own, every
third of the lease TTL: the attempt stays busy for every other worker until the run ends.
Its entry is not kept fresh meanwhile (the stream's reader lives on the blocked loop):
another worker may reclaim it, finds the attempt busy, and leaves it pending, counting
nothing. A process whose loop never comes back holds its attempts until it is stopped
(its liveness probe, served on that loop, fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import RedisError

from dispatcher.redis_client import RedisClient
from dispatcher.worker.dedup import AttemptGuard

__all__ = ["SideRenewal"]

log = logging.getLogger(__name__)


class SideRenewal:
    """Renews leases of ``guard`` on a connection of its own, from one other thread."""

    def __init__(self, guard: AttemptGuard, *, held: Callable[[], Sequence[str]]) -> None:
        self._guard = guard
        self._held = held  # the attempts whose leases the keeper holds (read across threads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._twin: AttemptGuard | None = None

    def renew(self) -> None:
        """In the watching thread: push every lease held a full TTL ahead."""
        keys = list(self._held())
        if not keys:
            return
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            kept = self._loop.run_until_complete(self._renew(keys))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("cannot renew leases while the event loop is blocked: %s", exc)
            return
        log.debug("renewed %d of %d leases while the event loop is blocked", kept, len(keys))

    async def _renew(self, keys: list[str]) -> int:
        if self._twin is None:
            timeout = self._guard.lease_ttl_ms / 3000
            self._twin = self._guard.on(_own_client(self._guard.client, timeout=timeout))
        async with asyncio.timeout(self._guard.lease_ttl_ms / 3000):
            return sum([await self._twin.renew(key) for key in keys])

    def close(self) -> None:
        """Close the connection and loop, once the watch has stopped: in a thread of their
        own, since the caller's thread runs the worker's loop."""
        loop, twin = self._loop, self._twin
        self._loop = self._twin = None
        if loop is None:
            return

        def shut() -> None:
            if twin is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(twin.client.aclose())
            loop.close()

        closing = threading.Thread(target=shut, name="side renewal close", daemon=True)
        closing.start()
        closing.join(timeout=5)


def _own_client(client: RedisClient, *, timeout: float) -> RedisClient:
    """A client to the same server with the same settings, for another event loop."""
    if isinstance(client, RedisCluster):
        kwargs = {k: v for k, v in client.connection_kwargs.items() if k != "connection_class"}
        kwargs["socket_timeout"] = kwargs.get("socket_timeout") or timeout
        nodes = [ClusterNode(node.host, node.port) for node in client.get_nodes()]
        return RedisCluster(startup_nodes=nodes, **kwargs)
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = kwargs.get("socket_timeout") or timeout
    own = ConnectionPool(connection_class=pool.connection_class, max_connections=2, **kwargs)
    return Redis(connection_pool=own)
