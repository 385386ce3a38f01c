"""The library's own Redis connection classes, and pre-packed commands sent in bulk.

redis-py 5-8 pack commands with hiredis only in the sync client; the asyncio
client packs every argument in Python, which showed in the enqueuer's CPU
while draining (a 50-row XADD pipeline is ~1,000 arguments). ``connect_redis``
makes its clients with the classes here (``packing_class`` maps redis-py's
TCP, TLS and Unix socket classes to ours), so an application that imports the
library and makes its own redis-py clients keeps redis-py's behaviour.

``execute_packed`` writes commands packed in advance (by PostgreSQL, or by
``pack_commands``) in one write and reads their replies in bulk from the
connection's hiredis reader: a reply error is returned in its place, as a
pipeline with ``raise_on_error=False`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis  # a dependency: redis[hiredis]
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "HiredisConnection",
    "HiredisPacking",
    "HiredisSSLConnection",
    "HiredisUnixConnection",
    "execute_packed",
    "pack_commands",
    "packing_class",
]


class HiredisPacking(AbstractConnection):
    """``pack_command`` in C (hiredis), as redis-py's sync client already does it.

    Arguments hiredis does not take (bool, None, bytearray, memoryview) and
    encodings other than strict UTF-8 go to redis-py's own packer, so the
    bytes on the wire and the errors raised are exactly what they were.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        utf8 = encoder.encoding.lower().replace("-", "") == "utf8"
        if utf8 and encoder.encoding_errors == "strict":
            if isinstance(args[0], str):
                args = (*args[0].encode().split(), *args[1:])
            elif b" " in args[0]:
                args = (*args[0].split(), *args[1:])
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return super().pack_command(*args)


class HiredisConnection(HiredisPacking, Connection):
    """redis-py's TCP connection, packing with hiredis."""


class HiredisSSLConnection(HiredisPacking, SSLConnection):
    """redis-py's TLS connection, packing with hiredis."""


class HiredisUnixConnection(HiredisPacking, UnixDomainSocketConnection):
    """redis-py's Unix socket connection, packing with hiredis."""


_OURS: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: HiredisConnection,
    SSLConnection: HiredisSSLConnection,
    UnixDomainSocketConnection: HiredisUnixConnection,
}


def packing_class(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    """Our class for redis-py's ``cls`` (a class of someone else's is kept as it is)."""
    return _OURS.get(cls, cls)


def pack_commands(commands: Iterable[Sequence[str | bytes | int]]) -> bytes:
    """Commands packed as RESP, one after another, ready for ``execute_packed``."""
    # hiredis's stub declares a 1-tuple where it takes any number of arguments
    return b"".join(hiredis.pack_command(tuple(command)) for command in commands)  # type: ignore[arg-type]


async def execute_packed(conn: AbstractConnection, packed: bytes, replies: int) -> list[Any]:
    """Send ``packed`` (``replies`` commands) in one write; their replies, in order.

    A reply error is returned as its exception. Anything raised on the way
    (a lost connection, a timeout, a cancellation) leaves the connection
    disconnected: replies may still be on their way, so it cannot be reused.
    """
    await conn.send_packed_command(packed)
    try:
        parser = conn._parser
        if not isinstance(parser, _AsyncHiredisParser) or parser._reader is None:
            return [await conn.read_response(disconnect_on_error=False) for _ in range(replies)]
        try:
            async with asyncio.timeout(conn.socket_timeout):
                return await _read_bulk(parser, replies)
        except TimeoutError:
            raise RedisTimeoutError(f"Timeout reading {replies} replies") from None
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _read_bulk(parser: _AsyncHiredisParser, replies: int) -> list[Any]:
    reader = parser._reader
    assert reader is not None
    out: list[Any] = []
    while len(out) < replies:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            await parser.read_from_socket()
            continue
        if isinstance(reply, RedisConnectionError):
            raise reply
        out.append(reply)
    return out
