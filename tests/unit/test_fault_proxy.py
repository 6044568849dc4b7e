"""The suite's fault proxy itself: closing it while clients keep connecting.

A client under test reconnects on its own (a robust broker connection tries every
0.1 s), so a test's proxy is often closed in the middle of a burst of connections.
Whatever it accepted by then must be closed with it: a socket left to the garbage
collector fails a later test with an unraisable ResourceWarning, far from its cause.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from support.faultproxy import FaultProxy

CLIENTS = 20  # under the listening socket's backlog: all are accepted at once


@pytest.fixture
def server() -> Iterator[int]:
    """A loopback server that accepts and keeps every connection: the proxy's target."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    kept: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                kept.append(listener.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, which a close does not
        listener.close()
        thread.join(timeout=10)
        for connection in kept:
            connection.close()


def test_a_proxy_closed_as_connections_are_accepted_leaves_no_socket_or_task_behind(
        server: int) -> None:
    """The close is made to land in the one loop step after asyncio accepted a burst of
    connections and before it set any of them up: the proxy's loop is held while the
    clients connect (the kernel completes their handshakes) and the close is queued."""
    proxy = FaultProxy(server)
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        let_go.wait()

    proxy._loop.call_soon_threadsafe(hold)
    held.wait()
    clients = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(CLIENTS)]
    queued = threading.Event()
    call_soon_threadsafe = proxy._loop.call_soon_threadsafe

    def queue(*args: Any) -> Any:
        handle = call_soon_threadsafe(*args)
        queued.set()
        return handle

    gc.collect()  # what earlier tests left to the collector is not counted here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with mock.patch.object(proxy._loop, "call_soon_threadsafe", side_effect=queue):
            closing = threading.Thread(target=proxy.close)
            closing.start()
            queued.wait()  # the close is next in the loop, before the accepting
        let_go.set()
        closing.join()
        for client in clients:
            client.close()
        left_pending = asyncio.all_tasks(proxy._loop)  # before the collector drops them
        gc.collect()
    assert left_pending == set()
    assert [str(warning.message) for warning in caught
            if issubclass(warning.category, ResourceWarning)] == []
