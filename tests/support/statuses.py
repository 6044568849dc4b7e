"""Reading an application's status stream in tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from sasflow import Status

WAIT_S = 30.0  # only a hang reaches it


async def statuses_until_processed(listening: AsyncGenerator[Status, None], task_id: str
                                   ) -> list[Status]:
    """The statuses of `task_id` heard on `listening` (an `app.alisten(queue)`), up to
    and with `processed`; the stream is closed after."""
    heard = []
    async with asyncio.timeout(WAIT_S), contextlib.aclosing(listening) as statuses:
        async for status in statuses:
            assert status.task_id == task_id
            heard.append(status)
            if status.event == "processed":
                break
    return heard
