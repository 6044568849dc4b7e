"""One naming rule for the sync and async twins (SPEC U2): `ax()` is the coroutine,
`x()` its blocking twin, made here from it and run on the client's background loop."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sasflow.background_loop import BackgroundLoop

__all__ = ["blocking"]

P = ParamSpec("P")
T = TypeVar("T")


class _HasLoop(Protocol):
    _loop: BackgroundLoop


def blocking(fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]
             ) -> Callable[Concatenate[Any, P], T]:
    """The blocking twin of the coroutine method `fn`, run on the client's loop."""

    @functools.wraps(fn)
    def call(self: _HasLoop, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._loop.call(fn(self, *args, **kwargs))

    call.__name__ = fn.__name__[1:].rstrip("_")  # aget -> get, await_ -> wait
    call.__qualname__ = f"{fn.__qualname__.rpartition('.')[0]}.{call.__name__}"
    call.__doc__ = f"Blocking twin of `{fn.__name__}`: {fn.__doc__ or ''}".rstrip(": ")
    return call
