"""Where an application's state lives and how its messages travel: the store and
the transport its URLs name, each opened on first use."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from sasflow.errors import ConfigurationError
from sasflow.store import Store, open_store
from sasflow.transport import Transport, open_transport

__all__ = ["DEFAULT_STORE", "Backends", "running_loop"]

DEFAULT_STORE = "sqlite:///sasflow.db"


class Backends:
    """The store ($SASFLOW_STORE, else sasflow.db here) and the transport
    ($SASFLOW_TRANSPORT, else in-process queues), opened when first asked for."""

    def __init__(self, store_url: str | None, transport_url: str | None, *,
                 max_payload_bytes: int, clock: Callable[[], float] | None) -> None:
        self.store_url = store_url
        self.transport_url = transport_url
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self._connect_within: float | None = None
        self._create = True
        self._store: Store | None = None
        self._transport: Transport | None = None
        # a broker's client is bound to the event loop it was opened on (None: none)
        self._transport_loop: asyncio.AbstractEventLoop | None = None

    @property
    def opened(self) -> bool:
        return self._store is not None or self._transport is not None

    def configure(self, *, store: str | None, transport: str | None,
                  connect_within: float | None, create: bool | None) -> None:
        if self.opened:
            raise ConfigurationError("configure() must come before the store is opened")
        self.store_url = store or self.store_url
        self.transport_url = transport or self.transport_url
        if connect_within is not None:
            self._connect_within = connect_within
        if create is not None:
            self._create = create

    def use(self, *, store: Store, transport: Transport) -> None:
        """Run on these instead of what the URLs name (a simulation's in-memory world)."""
        if self.opened:
            raise ConfigurationError("the store or transport is opened already")
        self._store, self._transport = store, transport

    @property
    def store(self) -> Store:
        if self._store is None:
            url = self.store_url or os.environ.get("SASFLOW_STORE") or DEFAULT_STORE
            self._store = open_store(url, clock=self.clock, create=self._create,
                                     connect_within=self._connect_within)
        return self._store

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            url = self.transport_url or os.environ.get("SASFLOW_TRANSPORT")
            # in-process queues die with the process: their dead letters go to the store
            self._transport = open_transport(url, max_message_bytes=self.max_payload_bytes,
                                             dead_letter_box=lambda: self.store)
            self._transport_loop = running_loop()
        return self._transport

    def detach_transport(self) -> Transport | None:
        """The transport, if open, forgotten here: for its owner to close on its loop."""
        transport, self._transport = self._transport, None
        return transport

    def detach_transport_of(self, loop: asyncio.AbstractEventLoop | None) -> Transport | None:
        """`detach_transport`, only if the transport was opened on `loop`."""
        if loop is None or self._transport_loop is not loop:
            return None
        return self.detach_transport()

    @property
    def opened_store(self) -> Store | None:
        """The store, if it was opened (without opening it)."""
        return self._store

    def detach_store(self) -> Store | None:
        store, self._store = self._store, None
        return store


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
