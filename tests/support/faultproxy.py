"""A TCP proxy a test controls, to partition one process from a server (SPEC R6).

The one fault proxy of the suite. The test points a client (a worker, a store, a
transport) at the proxy instead of the server (PostgreSQL, RabbitMQ, Redis) and
switches the proxy between four modes:

* ``pass``: bytes flow both ways, as without the proxy;
* ``black-hole``: connections stay open and new ones are accepted, but no byte
  goes through in either direction, as when a link or a firewall drops every
  packet. What was sent meanwhile waits, as TCP retransmission would keep it,
  and is delivered in order once the partition heals (``pass`` again): a write
  the client sent before the partition reaches the server after it, late;
* ``hold-answers``: the client's bytes reach the server, the server's answers
  wait (counted in `held`) until the mode changes: a reply or a confirm late;
* ``reset``: every open connection is reset (RST) and new ones are reset at once
  (counted in `refused`), as when the peer's host restarted or a firewall rejects.

Besides the modes, `cut_after(marker)` and `cut_before(marker)` lose one
statement's answer: the next client chunk holding `marker` is passed on to the
server (or dropped), then both sides are closed, and `fired` is set.

The proxy runs an asyncio loop in a thread of its own, so a synchronous test can
use it as well as an async one; it listens on 127.0.0.1 only and forwards to one
loopback address. Given a server-side `tls` context, it speaks TLS to its clients
(the server behind it is spoken to in the clear), as a TLS-terminating load
balancer in front of a broker does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Literal, TypeVar

__all__ = ["FaultProxy", "Mode", "fault_proxy"]

T = TypeVar("T")

Mode = Literal["pass", "black-hole", "hold-answers", "reset"]

_CHUNK = 1 << 16
# after a marked chunk, what else the client sends at once belongs to the same message
_REST_OF_MESSAGE = 0.2
# how long a closing proxy lets a connection it accepted finish its set-up (TLS)
_STOP_WITHIN = 10.0


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self) -> None:
        self.dead = False  # cut at a marker: nothing more goes back to the client


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, in the mode the test sets.

    `port` is the kernel's pick unless given; with `listening=False` nothing listens on
    it until `listen()`: a connection is refused meanwhile, as by a server that is down.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *, port: int = 0,
                 listening: bool = True, tls: ssl.SSLContext | None = None) -> None:
        self.target = (target_host, target_port)
        self.tls = tls
        self.port = port
        self.mode: Mode = "pass"
        self.connections = 0  # accepted so far
        self.forwarded = 0  # connections opened to the server
        self.refused = 0  # reset as soon as accepted: each one a reconnect the client tried
        self.held = 0  # answer chunks kept from the client while answers were held
        self.fired = threading.Event()  # a cut at a marker happened
        self._marker: bytes | None = None
        self._forward_marked = True
        self._loop = asyncio.new_event_loop()
        self._requests = asyncio.Event()  # set: the client's bytes flow to the server
        self._answers = asyncio.Event()  # set: the server's bytes flow to the client
        self._requests.set()
        self._answers.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._accepting: set[asyncio.Task[None]] = set()  # (held: a task is weakly held)
        self._server: asyncio.Server | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)
        self._thread.start()
        if listening:
            self.listen()

    # ------------------------------------------------------------ the test's side
    def listen(self) -> None:
        """Accept connections on `port` from now on."""
        self.port = self._call(self._start(self.port))

    def set_mode(self, mode: Mode) -> None:
        """Switch mode; returns once the proxy acts on it (reset: connections are gone)."""
        self._call(self._set_mode(mode))

    def cut_after(self, marker: bytes) -> None:
        """The next client chunk holding `marker` reaches the server, whose answer is lost."""
        self._arm(marker, forward=True)

    def cut_before(self, marker: bytes) -> None:
        """The next client chunk holding `marker` is lost: the server never gets it."""
        self._arm(marker, forward=False)

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

    def _arm(self, marker: bytes, *, forward: bool) -> None:
        self.fired.clear()
        self._forward_marked = forward
        self._marker = marker

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    # ------------------------------------------------------------ the loop's side
    async def _start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", port,
                                                  ssl=self.tls)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def _stop(self) -> None:
        """Refuse new connections, reset every open one and end every task: no socket
        outlives the loop, and no task is left pending in it."""
        self._stopping = True  # from now on a connection is reset as it is accepted
        loop = asyncio.get_running_loop()
        listening = self._server.sockets if self._server is not None else ()
        for sock in listening:  # accept no more, the server still open
            loop.remove_reader(sock.fileno())
        # asyncio's own accept tasks, one per connection accepted already, are left to
        # finish, each handing its connection to `_accepted`, which now resets it. Not
        # before: cancelled before it starts, such a task drops its socket unclosed, and
        # once the server is closed it fails to make the connection's transport and
        # drops both (Python 3.11's `Server._attach` asserts the server is open).
        while others := [task for task in asyncio.all_tasks()
                         if task is not asyncio.current_task()]:
            for writer in list(self._writers):
                _reset(writer)
            for task in others:
                if task in self._accepting:
                    task.cancel()
            _, unfinished = await asyncio.wait(others, timeout=_STOP_WITHIN)
            for task in unfinished:  # a client stuck in its TLS handshake
                task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        for event, flows in ((self._requests, mode in ("pass", "hold-answers")),
                             (self._answers, mode == "pass")):
            if flows:
                event.set()
            else:
                event.clear()
        if mode == "reset":
            for writer in list(self._writers):
                _reset(writer)

    def _resetting(self) -> bool:
        return self.mode == "reset"

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the connection is known as it is accepted, not when its task first runs: a
        # stop that cancels the task before then still resets it (else its socket
        # outlived the loop, unclosed)
        self._writers.add(writer)
        if self._stopping:
            _reset(writer)
            return
        task = asyncio.get_running_loop().create_task(self._accept(reader, writer))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._connect(reader, writer)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._resetting():
            self.refused += 1
            _reset(writer)
            return
        await self._requests.wait()  # a black hole accepts, then connects nowhere
        if self._resetting():  # the mode may have changed while this connection waited
            self.refused += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self.forwarded += 1
        link = _Link()
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._up(reader, up_writer, writer, link),
                                 self._down(up_reader, writer, link))
        finally:
            self._writers.discard(up_writer)
            up_writer.close()

    async def _up(self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter,
                  writer: asyncio.StreamWriter, link: _Link) -> None:
        """The client's bytes to the server; in a black hole each chunk waits to heal."""
        try:
            while chunk := await reader.read(_CHUNK):
                await self._requests.wait()
                if self._marker is not None and self._marker in chunk:
                    await self._cut(chunk, reader, up_writer, writer, link)
                    return
                up_writer.write(chunk)
                await up_writer.drain()
            if up_writer.can_write_eof():
                up_writer.write_eof()
        except (ConnectionError, OSError):
            _reset(up_writer)

    async def _cut(self, chunk: bytes, reader: asyncio.StreamReader,
                   up_writer: asyncio.StreamWriter, writer: asyncio.StreamWriter,
                   link: _Link) -> None:
        """Lose the marked message's answer: the server gets the message (a long one may
        come in several chunks) or nothing of it, then end of file; the client an RST."""
        self._marker = None
        link.dead = True
        if self._forward_marked:
            while chunk:
                up_writer.write(chunk)
                await up_writer.drain()
                try:
                    async with asyncio.timeout(_REST_OF_MESSAGE):
                        chunk = await reader.read(_CHUNK)
                except TimeoutError:
                    break
        writer.transport.abort()
        self.fired.set()
        up_writer.close()

    async def _down(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link) -> None:
        """The server's bytes to the client, unless answers are held or the link was cut."""
        try:
            while chunk := await up_reader.read(_CHUNK):
                if not self._answers.is_set():
                    self.held += 1
                    await self._answers.wait()
                if link.dead:
                    break
                writer.write(chunk)
                await writer.drain()
            if link.dead:
                writer.transport.abort()
            elif writer.can_write_eof():
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
