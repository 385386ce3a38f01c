"""Redis connections: one factory for standalone Redis and Redis Cluster.

Everything else takes a ``RedisClient`` and works the same on both; only code
that must know the topology (per-node round trips, node lists) asks which one
it has.
"""

from __future__ import annotations

import logging
from typing import Any

import hiredis  # a dependency: redis[hiredis]
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

__all__ = [
    "RedisClient",
    "check_eviction_policy",
    "connect_redis",
    "memory_infos",
    "use_hiredis_packing",
]

log = logging.getLogger(__name__)

RedisClient = Redis | RedisCluster

_python_pack_command = AbstractConnection.pack_command


def _hiredis_pack_command(self: AbstractConnection, *args: Any) -> list[bytes]:
    """``pack_command`` in C (hiredis), as redis-py's sync client already does it.

    Arguments hiredis does not take (bool, None, bytearray, memoryview) and
    encodings other than strict UTF-8 go to redis-py's own packer, so the
    bytes on the wire and the errors raised are exactly what they were.
    """
    encoder = self.encoder
    if encoder.encoding.lower().replace("-", "") == "utf8" and encoder.encoding_errors == "strict":
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            pass
    return _python_pack_command(self, *args)


def use_hiredis_packing() -> bool:
    """Let redis-py's asyncio connections pack commands with hiredis; True if in effect.

    redis-py 5-8 use hiredis to pack commands only in the sync client; the
    asyncio client packs every argument in Python, which was 37 % of the
    enqueuer's CPU while draining (a 50-row XADD pipeline is ~1,000
    arguments). Patching the one method covers standalone and Cluster
    connections alike (the Cluster client does not take a connection class).
    """
    if not hasattr(hiredis, "pack_command"):  # hiredis < 2
        return False
    AbstractConnection.pack_command = _hiredis_pack_command  # type: ignore[method-assign]
    return True


def connect_redis(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout: float | None = None,
    health_check_interval: int = 30,
) -> RedisClient:
    """Create (lazily connecting) an asyncio client for ``url``.

    Responses are decoded to ``str``: stream fields are UTF-8 JSON text.
    """
    use_hiredis_packing()
    if cluster:
        return RedisCluster.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            health_check_interval=health_check_interval,
        )
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout,
        health_check_interval=health_check_interval,
    )


async def memory_infos(client: RedisClient) -> list[dict[str, Any]]:
    """``INFO memory`` of the server, or of every master of a Cluster."""
    if isinstance(client, RedisCluster):
        replies = await client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return [reply for reply in replies.values() if isinstance(reply, dict)]
    return [await client.info("memory")]


async def check_eviction_policy(client: RedisClient) -> str | None:
    """Warn loudly unless Redis is set to ``maxmemory-policy noeviction``; return the policy.

    ``allkeys-*`` policies may evict stream entries (tasks lost); ``volatile-*`` ones may
    evict lease and done keys (an attempt run twice).
    """
    try:
        policies = {str(info.get("maxmemory_policy", "?")) for info in await memory_infos(client)}
    except (RedisError, OSError) as exc:
        log.debug("could not read maxmemory-policy: %s", exc)
        return None
    policy = ",".join(sorted(policies))
    if policies != {"noeviction"}:
        what = "stream entries (tasks lost)" if "allkeys" in policy else "lease and done keys"
        log.error(
            "Redis maxmemory-policy is %s: when Redis is full it evicts %s; set it to "
            "noeviction (the enqueuer pauses before Redis fills up)",
            policy,
            what,
        )
    return policy
