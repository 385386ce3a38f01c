"""Redis connections: one factory for standalone Redis and Redis Cluster.

Everything else takes a ``RedisClient`` and works the same on both; only code
that must know the topology (per-node round trips, node lists) asks which one
it has.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis, RedisCluster

__all__ = ["RedisClient", "connect_redis", "redact_url"]

RedisClient = Redis | RedisCluster


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


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: safe to log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
