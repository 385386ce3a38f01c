"""A small TCP proxy for fault tests: add latency, blackhole, or reset connections.

It runs its own asyncio loop in a daemon thread, so sync and async tests use
it alike. Put it between a process and its server (``proxy.port`` instead of
the server's port) and change its mode while traffic flows:

- ``latency(seconds)``: every chunk is delivered that much later;
- ``blackhole()``: accepted connections and new ones carry nothing either
  way; bytes are held, as TCP would retransmit them, and flow again on
  ``heal()`` (a network partition that ends);
- ``reset()``: every open connection is closed with a RST (SO_LINGER 0),
  both sides; new connections are fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from dispatcher.demo.throwaway import free_port

__all__ = ["TcpProxy", "tcp_proxy"]


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.delay = 0.0
        self.connections = 0
        self._flowing: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    # -- control, from any thread -------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def latency(self, seconds: float) -> None:
        self.delay = seconds

    def blackhole(self) -> None:
        self._call(self._set_flowing(False))

    def heal(self) -> None:
        self.delay = 0.0
        self._call(self._set_flowing(True))

    def reset(self) -> int:
        """RST every open connection; return how many."""
        return int(self._call(self._reset()))

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    # -- the loop side ----------------------------------------------------------

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        if self._server:
            self._server.close()
        await self._reset()

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _reset(self) -> int:
        pairs = list(self._pairs)
        for a, b in pairs:
            for writer in (a, b):
                _abort(writer)
        self._pairs.clear()
        return len(pairs)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        try:
            await self._flowing.wait()
            s_reader, s_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(c_writer)
            return
        pair = (c_writer, s_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pipe(c_reader, s_writer),
                self._pipe(s_reader, c_writer),
                return_exceptions=True,
            )
        finally:
            self._pairs.discard(pair)
            for writer in pair:
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while chunk := await reader.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.write_eof()


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.fixture
def tcp_proxy() -> Iterator[type[TcpProxy]]:
    """A factory of proxies (``tcp_proxy(target_port).start()``), all stopped at teardown."""
    started: list[TcpProxy] = []

    class Tracked(TcpProxy):
        def start(self) -> TcpProxy:
            started.append(self)
            return super().start()

    yield Tracked
    for proxy in started:
        proxy.stop()
