"""A private event loop in a background thread: the blocking methods' way into
the async core (STYLE: an async core with a thin sync facade, not two copies)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["BackgroundLoop", "refuse_inside_a_loop"]

T = TypeVar("T")


def refuse_inside_a_loop() -> None:
    """A blocking call made from a coroutine would stall its event loop: say so."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("inside an event loop: use the async twin (await app.a...)")


class BackgroundLoop:
    """An event loop started on first use, in a daemon thread, until `close`."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="sasflow-loop",
                                                daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> asyncio.AbstractEventLoop | None:
        """The loop, if it runs (without starting one)."""
        with self._lock:
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the background loop and wait for its result (sync callers only)."""
        try:
            refuse_inside_a_loop()
        except RuntimeError:
            coro.close()
            raise
        return self.run(coro)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`call` for quick lifecycle steps, which may also come from another event loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
