"""Waiting for a positive signal: the one polling loop of the tests that run processes.

Every wait has a hang guard, never a claim about speed: on a loaded 2-core machine
the thing waited for comes late, but it comes. What timed out says what it waited
for and, through `explain`, what the processes were doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(what: str, condition: Callable[[], T | None], *, timeout: float,
             poll: float = 0.02, explain: Callable[[], str] = lambda: "") -> T:
    """Poll `condition` until it is truthy and return its value; fail after `timeout`
    seconds naming `what`, with `explain()`'s account of the state."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{explain()}",
                        pytrace=False)
        time.sleep(poll)
