"""Retries inside an agent, bounded by attempts AND by the step's complete-by (S3, S5).

Modelled on stamina: a policy names what it retries (everything but
PermanentError), is bounded in attempts and in time, and backs off with jittered
exponential waits. tenacity does the waiting and counting underneath; the first
attempt is made directly, so the common case (success at once) pays nothing for
the machinery.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)
from tenacity.stop import stop_base

from sasflow.breaker import CircuitBreaker
from sasflow.errors import PermanentError

__all__ = ["RetryPolicy", "call_with_retries"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 10  # at most, per dispatch of a step
    initial_wait: float = 0.05
    max_wait: float = 2.0
    jitter: float = 0.05

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.initial_wait < 0 or self.max_wait < 0 or self.jitter < 0:
            raise ValueError("attempts must be >= 1 and waits >= 0")


def _no_waiting() -> bool:
    # like stamina's testing switch: SASFLOW_TESTING_NO_BACKOFF=1 removes the waits
    return os.environ.get("SASFLOW_TESTING_NO_BACKOFF") == "1"


class _StopAtDeadline(stop_base):
    """Stop when the next wait would end past the deadline: no attempt can finish."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline, self.clock = deadline, clock

    def __call__(self, state: RetryCallState) -> bool:
        return self.clock() + (state.upcoming_sleep or 0.0) >= self.deadline


async def call_with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breaker: CircuitBreaker,
    deadline: float,
    clock: Callable[[], float] = time.time,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """Call `attempt(n)` until it succeeds, raises PermanentError, or the bounds end.

    The breaker sees every attempt: when open, attempts fail fast without
    calling. The caller enforces the deadline itself (by cancelling at it); this
    only avoids starting waits that would end past it. `on_retry` is called before
    each attempt after the first (the metrics count retries with it).
    """

    async def guarded(n: int) -> T:
        breaker.before_call()
        try:
            result = await attempt(n)
        except PermanentError:
            breaker.succeeded()  # the service answered: it is up, it just said no
            raise
        except BaseException as error:
            if isinstance(error, Exception):
                breaker.failed()
            else:
                breaker.released()
            raise
        breaker.succeeded()
        return result

    try:
        return await guarded(1)
    except PermanentError:
        raise
    except Exception:
        if policy.attempts == 1:
            raise
    # exponential from initial_wait, capped, plus up to `jitter` seconds of noise
    # (composed from tenacity's oldest, stable waits, any 8.3+ release will do)
    wait: Any = (wait_exponential(multiplier=policy.initial_wait, max=policy.max_wait)
                 + wait_random(0, policy.jitter)
                 if not _no_waiting() else (lambda _state: 0.0))
    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts - 1) | _StopAtDeadline(deadline, clock),
        wait=wait,
        retry=retry_if_not_exception_type(PermanentError),
        reraise=True,
    )
    async for try_ in retrying:
        with try_:
            if on_retry is not None:
                on_retry()
            return await guarded(try_.retry_state.attempt_number + 1)
    raise AssertionError("unreachable: tenacity either returns or reraises")
