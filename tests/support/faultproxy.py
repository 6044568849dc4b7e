"""A TCP proxy a test controls, to partition one process from a server (SPEC R6).

The test points one worker at the proxy instead of the server (PostgreSQL,
RabbitMQ, Redis) and switches the proxy between three modes:

* ``pass``: bytes flow both ways, as without the proxy;
* ``black-hole``: connections stay open and new ones are accepted, but no byte
  goes through in either direction, as when a link or a firewall drops every
  packet. What was sent meanwhile waits, as TCP retransmission would keep it,
  and is delivered in order once the partition heals (``pass`` again): a write
  the client sent before the partition reaches the server after it, late;
* ``reset``: every open connection is reset (RST) and new ones are reset at once,
  as when the peer's host restarted or a firewall rejects.

The proxy runs an asyncio loop in a thread of its own, so a synchronous test can
use it; it listens on 127.0.0.1 only and forwards to one loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Literal, TypeVar

__all__ = ["FaultProxy", "Mode", "fault_proxy"]

T = TypeVar("T")

Mode = Literal["pass", "black-hole", "reset"]

_CHUNK = 1 << 16


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, in the mode the test sets."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)
        self._thread.start()
        self.port: int = self._call(self._start())

    # ------------------------------------------------------------ the test's side
    def set_mode(self, mode: Mode) -> None:
        """Switch mode; returns once the proxy acts on it (reset: connections are gone)."""
        self._call(self._set_mode(mode))

    def url(self, url: str) -> str:
        """`url` with its loopback port replaced by the proxy's."""
        host, port = self.target
        for form in (f"{host}:{port}", f"localhost:{port}"):
            if form in url:
                return url.replace(form, f"127.0.0.1:{self.port}", 1)
        raise ValueError(f"{url} does not name {host}:{port}")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    # ------------------------------------------------------------ the loop's side
    async def _start(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            _reset(writer)

    async def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "pass":
            self._flowing.set()
        else:
            self._flowing.clear()
        if mode == "reset":
            for writer in list(self._writers):
                _reset(writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._resetting():
            _reset(writer)
            return
        await self._flowing.wait()  # a black hole accepts, then connects nowhere
        if self._resetting():  # the mode may have changed while this connection waited
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self._writers.discard(end)
                end.close()

    def _resetting(self) -> bool:
        return self.mode == "reset"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until EOF; in a black hole each chunk waits for the partition to heal."""
        try:
            while chunk := await reader.read(_CHUNK):
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN: the peer sees ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def fault_proxy(target_port: int) -> Iterator[FaultProxy]:
    """A FaultProxy closed afterwards, whatever happened."""
    proxy = FaultProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
