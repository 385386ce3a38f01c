"""Redis connections: one factory for standalone Redis and Redis Cluster.

Everything else takes a ``RedisClient`` and works the same on both; only code
that must know the topology (per-node round trips, node lists) asks which one
it has.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.client import NEVER_DECODE
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from dispatcher.config import CONNECT_TIMEOUT, ConfigError
from dispatcher.redis_connection import packing_class

__all__ = [
    "RedisClient",
    "RedisNotDurable",
    "aof_enabled",
    "check_eviction_policy",
    "check_persistence",
    "connect_redis",
    "first_answer",
    "get_raw",
    "queue_get_raw",
    "server_infos",
]

log = logging.getLogger(__name__)

RedisClient = Redis | RedisCluster
# A reply kept as bytes by a client that decodes: a control key may hold bytes that are not
# UTF-8, which its reader must refuse as a value, not crash on (with the connection's reply).
_RAW = {NEVER_DECODE: True}


async def get_raw(client: RedisClient, key: str) -> bytes | None:
    """``GET key`` as bytes (None if absent), whatever the client decodes."""
    raw: bytes | None = await client.execute_command("GET", key, **_RAW)
    return raw


def queue_get_raw(pipe: Any, key: str) -> None:
    """Queue ``GET key`` on a pipeline, its reply as bytes."""
    pipe.execute_command("GET", key, **_RAW)


def connect_redis(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout: float | None = None,
    socket_connect_timeout: float = 10.0,
    health_check_interval: int = 30,
) -> RedisClient:
    """Create (lazily connecting) an asyncio client for ``url``.

    Responses are decoded to ``str``: stream fields are UTF-8 JSON text. Its
    connections pack commands with hiredis (``dispatcher.redis_connection``).
    """
    if cluster:
        cluster_client = RedisCluster.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            health_check_interval=health_check_interval,
        )
        # RedisCluster takes no connection class (it picks redis-py's TCP or TLS one); its
        # nodes, made now and on every refresh of the slot map, take theirs from here.
        kwargs = cluster_client.connection_kwargs
        kwargs["connection_class"] = packing_class(kwargs["connection_class"])
        for node in cluster_client.nodes_manager.startup_nodes.values():
            node.connection_class = kwargs["connection_class"]
        return cluster_client
    client = Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        health_check_interval=health_check_interval,
    )
    pool = client.connection_pool
    pool.connection_class = packing_class(pool.connection_class)
    return client


async def first_answer(client: RedisClient, *, within: float = CONNECT_TIMEOUT) -> None:
    """A ``PING`` answered within ``within`` seconds, else ``redis.exceptions.TimeoutError``.

    A server that accepts and never answers would hold a client without a read timeout
    for ever, and one with a timeout for each of redis-py's retries: the first round trip
    of a command or a start-up is bounded here, once.
    """
    try:
        async with asyncio.timeout(within):
            await client.ping()
    except TimeoutError:
        raise RedisTimeout(f"no answer within {within:g} s") from None


async def server_infos(client: RedisClient, section: str) -> list[dict[str, Any]]:
    """``INFO <section>`` of the server, or of every master of a Cluster."""
    if isinstance(client, RedisCluster):
        replies = await client.info(section, target_nodes=RedisCluster.PRIMARIES)
        return [reply for reply in replies.values() if isinstance(reply, dict)]
    return [await client.info(section)]


async def check_eviction_policy(client: RedisClient) -> str | None:
    """Warn loudly unless Redis is set to ``maxmemory-policy noeviction``; return the policy.

    ``allkeys-*`` policies may evict stream entries (tasks lost); ``volatile-*`` ones may
    evict lease and done keys (an attempt run twice).
    """
    try:
        policies = {
            str(info.get("maxmemory_policy", "?")) for info in await server_infos(client, "memory")
        }
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


class RedisNotDurable(ConfigError):
    """``--require-aof`` and Redis runs without AOF: the process refuses to start."""


async def aof_enabled(client: RedisClient) -> bool:
    """Whether Redis (every master of a Cluster) runs with ``appendonly yes``."""
    infos = await server_infos(client, "persistence")
    return all(int(info.get("aof_enabled", 0) or 0) == 1 for info in infos)


async def check_persistence(client: RedisClient, *, require: bool) -> bool | None:
    """Log an ERROR unless Redis runs with AOF, or with ``require`` refuse; return whether it does.

    Without AOF a restart of Redis loses every stream, so tasks published and not yet handled
    vanish with no trace in the outbox (RDB snapshots, if any, only narrow the loss).
    """
    try:
        durable = await aof_enabled(client)
    except (RedisError, OSError) as exc:
        if require:
            raise RedisNotDurable(
                f"cannot read INFO persistence to check AOF ({exc}); grant +info or drop "
                "--require-aof (REQUIRE_AOF)"
            ) from None
        log.debug("could not read INFO persistence: %s", exc)
        return None
    if durable:
        return True
    risk = (
        "Redis runs without AOF (appendonly no): the tasks in its streams are lost when it "
        "restarts; set appendonly yes"
    )
    if require:
        raise RedisNotDurable(f"{risk} (refused by --require-aof / REQUIRE_AOF)")
    log.error("%s, or pass --require-aof to refuse to start without it", risk)
    return False
