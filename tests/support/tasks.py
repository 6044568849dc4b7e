"""A coroutine run beside a test's block."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

__all__ = ["running"]


@contextlib.asynccontextmanager
async def running(coroutine: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """`coroutine` as a task while inside (a consumer, a watch); cancelled, and awaited,
    after."""
    task = asyncio.create_task(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
