"""The parts of redis-py's private API that ``dispatcher.redis_connection`` reads, still there.

redis-py is pinned below its next major (pyproject.toml); within it, a release
that moved these would quietly send every bulk read down the slow path (one
``read_response`` per reply). This fails loudly instead.
"""

from __future__ import annotations

from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser

from dispatcher.redis_client import RedisClient


async def test_our_connections_read_through_a_hiredis_reader(
    redis_standalone: RedisClient,
) -> None:
    await redis_standalone.ping()
    pool = redis_standalone.connection_pool  # type: ignore[union-attr]
    conn = await pool.get_connection()
    try:
        parser = conn._parser
        assert isinstance(parser, _AsyncHiredisParser), type(parser)
        assert parser._reader is not None
        assert parser._reader.gets() is NOT_ENOUGH_DATA  # nothing pending: the sentinel
        assert callable(parser.read_from_socket)
    finally:
        await pool.release(conn)
