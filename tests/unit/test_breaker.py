"""The circuit breaker, with an injected clock: time is moved, never slept."""

from __future__ import annotations

import pytest

from sasflow.breaker import BreakerState, CircuitBreaker, CircuitOpenError
from sasflow.errors import SasflowError


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """The breaker's state now (a function, so each read is fresh to the type checker)."""
    return breaker.state


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker("payments", failure_threshold=3, reset_timeout=5.0, clock=clock)


def fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        breaker.before_call()
        breaker.failed()


def test_stays_closed_below_the_threshold(breaker: CircuitBreaker) -> None:
    """N-1 consecutive failures leave calls going through."""
    fail(breaker, 2)
    assert state_of(breaker) is BreakerState.CLOSED
    breaker.before_call()  # does not raise


def test_opens_after_n_consecutive_failures_and_fails_fast(breaker: CircuitBreaker) -> None:
    """The Nth consecutive failure opens it; calls then fail fast with CircuitOpenError."""
    fail(breaker, 3)
    assert state_of(breaker) is BreakerState.OPEN
    with pytest.raises(CircuitOpenError, match="circuit of agent 'payments' is open") as caught:
        breaker.before_call()
    assert caught.value.agent == "payments"
    assert isinstance(caught.value, SasflowError)


def test_a_success_resets_the_consecutive_count(breaker: CircuitBreaker) -> None:
    """Failures must be consecutive: a success in between starts the count again."""
    fail(breaker, 2)
    breaker.before_call()
    breaker.succeeded()
    fail(breaker, 2)
    assert state_of(breaker) is BreakerState.CLOSED


def test_stays_open_until_the_reset_timeout(breaker: CircuitBreaker,
                                            clock: FakeClock) -> None:
    """Open for reset_timeout seconds, then half-open."""
    fail(breaker, 3)
    clock.advance(4.999)
    assert state_of(breaker) is BreakerState.OPEN
    with pytest.raises(CircuitOpenError):
        breaker.before_call()
    clock.advance(0.001)
    assert state_of(breaker) is BreakerState.HALF_OPEN


def test_half_open_lets_exactly_one_probe_through(breaker: CircuitBreaker,
                                                  clock: FakeClock) -> None:
    """Half-open: the first call is the probe; others fail fast while it is out."""
    fail(breaker, 3)
    clock.advance(5.0)
    breaker.before_call()  # the probe
    for _ in range(3):
        with pytest.raises(CircuitOpenError):
            breaker.before_call()


def test_a_successful_probe_closes_the_circuit(breaker: CircuitBreaker,
                                               clock: FakeClock) -> None:
    """Probe success: closed again, calls flow, and the failure count starts from zero."""
    fail(breaker, 3)
    clock.advance(5.0)
    breaker.before_call()
    breaker.succeeded()
    assert state_of(breaker) is BreakerState.CLOSED
    fail(breaker, 2)
    assert state_of(breaker) is BreakerState.CLOSED


def test_a_failed_probe_reopens_for_a_full_timeout(breaker: CircuitBreaker,
                                                   clock: FakeClock) -> None:
    """Probe failure: open at once (no N failures needed) for another reset_timeout."""
    fail(breaker, 3)
    clock.advance(5.0)
    breaker.before_call()
    breaker.failed()
    assert state_of(breaker) is BreakerState.OPEN
    clock.advance(4.9)
    with pytest.raises(CircuitOpenError):
        breaker.before_call()
    clock.advance(0.1)
    breaker.before_call()  # the next probe


def test_a_released_probe_lets_another_probe_go(breaker: CircuitBreaker,
                                                clock: FakeClock) -> None:
    """A probe cancelled at its deadline says nothing: the next caller may probe."""
    fail(breaker, 3)
    clock.advance(5.0)
    breaker.before_call()
    breaker.released()
    breaker.before_call()  # does not raise
    with pytest.raises(CircuitOpenError):
        breaker.before_call()


def test_threshold_one_opens_on_the_first_failure(clock: FakeClock) -> None:
    """failure_threshold=1: one failure is enough."""
    breaker = CircuitBreaker("x", failure_threshold=1, reset_timeout=1.0, clock=clock)
    fail(breaker, 1)
    assert state_of(breaker) is BreakerState.OPEN


@pytest.mark.parametrize(("threshold", "reset"), [(0, 1.0), (3, 0.0), (3, -1.0)])
def test_bad_settings_are_refused(threshold: int, reset: float) -> None:
    """A breaker needs a threshold >= 1 and a positive reset timeout."""
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker("x", failure_threshold=threshold, reset_timeout=reset)
