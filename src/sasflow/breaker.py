"""A circuit breaker per agent (SPEC S3): stop calling a service that keeps failing.

closed --N consecutive failures--> open --reset_timeout--> half-open
half-open: one probe call at a time; success closes, failure opens again.

Small enough to own: the maintained Python breakers either are synchronous only
(pybreaker's async path needs Tornado) or bring their own retry and storage
layers; this one takes an injected clock so tests move time instead of sleeping.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from sasflow.errors import SasflowError

__all__ = ["CircuitBreaker", "CircuitOpenError"]


class CircuitOpenError(SasflowError):
    """The breaker is open: the call was not made (a transient failure)."""


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    def __init__(self, name: str, *, failure_threshold: int = 5, reset_timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1 or reset_timeout <= 0:
            raise ValueError("failure_threshold must be >= 1 and reset_timeout > 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._state = BreakerState.CLOSED
        self._probing = False
        self.trips = 0  # times it opened: read by the metrics when scraped (metrics.py)

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and (
            self._clock() - self._opened_at >= self.reset_timeout):
            return BreakerState.HALF_OPEN
        return self._state

    def before_call(self) -> None:
        """Raise CircuitOpenError unless a call may go through now."""
        state = self.state
        if state is BreakerState.CLOSED:
            return
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._state, self._probing = BreakerState.HALF_OPEN, True
            return
        raise CircuitOpenError(f"circuit of agent {self.name!r} is open", agent=self.name)

    def succeeded(self) -> None:
        self._failures, self._probing = 0, False
        self._state = BreakerState.CLOSED

    def failed(self) -> None:
        self._failures += 1
        if self._probing or self._failures >= self.failure_threshold:
            if self._state is not BreakerState.OPEN:
                self.trips += 1
            self._state, self._opened_at, self._probing = BreakerState.OPEN, self._clock(), False

    def released(self) -> None:
        """A call ended without telling us anything (cancelled at its deadline)."""
        self._probing = False
