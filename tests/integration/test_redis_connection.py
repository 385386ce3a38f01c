"""The library's Redis connections pack with hiredis; redis-py's own classes are left alone.

An application that imports the library and makes its own redis-py clients
keeps redis-py's behaviour: nothing is patched process-wide.
"""

from __future__ import annotations

import redis.asyncio.connection as redis_connection
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection

import dispatcher
from dispatcher.redis_client import connect_redis
from dispatcher.redis_connection import HiredisPacking, execute_packed, pack_commands
from tests.redis_cluster import RedisClusterProcess

PYTHON_PACK = AbstractConnection.pack_command


async def test_using_the_library_leaves_redis_py_untouched(redis_url: str) -> None:
    assert dispatcher.__name__  # imported
    client = connect_redis(redis_url)
    await client.set("k", "v")
    await client.aclose()

    assert redis_connection.AbstractConnection.pack_command is PYTHON_PACK
    assert redis_connection.Connection.pack_command is PYTHON_PACK
    own = Redis.from_url(redis_url)
    await own.ping()
    (conn,) = own.connection_pool._available_connections
    assert not isinstance(conn, HiredisPacking)
    await own.aclose()


async def test_the_library_connections_pack_with_hiredis(redis_url: str) -> None:
    client = connect_redis(redis_url)
    assert isinstance(client, Redis)
    await client.set("k", "é")
    (conn,) = client.connection_pool._available_connections
    assert isinstance(conn, HiredisPacking)
    assert conn.pack_command("SET", "k", "é") == [
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"
    ]
    assert await client.get("k") == "é"
    await client.aclose()


async def test_tls_urls_keep_tls(redis_url: str) -> None:
    client = connect_redis(redis_url.replace("redis://", "rediss://"))
    assert isinstance(client, Redis)
    cls = client.connection_pool.connection_class
    assert issubclass(cls, HiredisPacking)
    assert issubclass(cls, redis_connection.SSLConnection)
    await client.aclose()


async def test_cluster_nodes_pack_with_hiredis(redis_cluster_process: RedisClusterProcess) -> None:
    client = connect_redis(redis_cluster_process.url, cluster=True)
    assert isinstance(client, RedisCluster)
    await client.set("k", "v")
    nodes = client.get_nodes()
    assert len(nodes) >= 3
    for node in nodes:
        assert issubclass(node.connection_class, HiredisPacking)
    await client.delete("k")
    await client.aclose()
    assert AbstractConnection.pack_command is PYTHON_PACK


async def test_packed_commands_run_with_their_replies_in_order(redis_url: str) -> None:
    client = connect_redis(redis_url)
    assert isinstance(client, Redis)
    packed = pack_commands([("SET", "a", "1"), ("INCR", "a"), ("LPUSH", "a", "x"), ("GET", "a")])
    conn = await client.connection_pool.get_connection()
    try:
        replies = await execute_packed(conn, packed, 4)
    finally:
        await client.connection_pool.release(conn)
    assert replies[:2] == ["OK", 2]
    assert isinstance(replies[2], Exception)
    assert str(replies[2]).startswith("WRONGTYPE")
    assert replies[3] == "2"
    assert await client.ping()  # the connection is still in step
    await client.aclose()
