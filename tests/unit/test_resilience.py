"""call_with_retries: bounded by attempts and by the deadline; PermanentError is final."""

from __future__ import annotations

import asyncio
import time

import pytest

from sasflow.breaker import BreakerState, CircuitBreaker, CircuitOpenError
from sasflow.errors import PermanentError
from sasflow.resilience import RetryPolicy, call_with_retries


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """The breaker's state now (a function, so each read is fresh to the type checker)."""
    return breaker.state


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Remote:
    """A remote call that fails `failures` times (with `error`), then answers."""

    def __init__(self, clock: FakeClock, *, failures: int = 0,
                 error: Exception | None = None, cost: float = 0.0) -> None:
        self.clock, self.failures, self.cost = clock, failures, cost
        self.error = error or ConnectionError("connection refused")
        self.calls: list[int] = []

    async def __call__(self, attempt: int) -> str:
        self.calls.append(attempt)
        self.clock.now += self.cost  # each call takes this long on the fake clock
        if len(self.calls) <= self.failures:
            raise self.error
        return f"ok after {attempt}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real backoff waits, even where the testing switch is on for the whole run."""
    monkeypatch.setenv("SASFLOW_TESTING_NO_BACKOFF", "0")


def breaker_for(clock: FakeClock, threshold: int = 100) -> CircuitBreaker:
    return CircuitBreaker("svc", failure_threshold=threshold, reset_timeout=5.0, clock=clock)


async def call(remote: Remote, clock: FakeClock, *, attempts: int = 5,
               deadline: float = 1e12, breaker: CircuitBreaker | None = None,
               initial_wait: float = 0.05, max_wait: float = 2.0, jitter: float = 0.0) -> str:
    return await call_with_retries(
        remote, policy=RetryPolicy(attempts=attempts, initial_wait=initial_wait,
                                   max_wait=max_wait, jitter=jitter),
        breaker=breaker or breaker_for(clock), deadline=deadline, clock=clock)


async def test_success_at_once_calls_once(clock: FakeClock) -> None:
    """The common case: one call, its result returned."""
    remote = Remote(clock)
    assert await call(remote, clock) == "ok after 1"
    assert remote.calls == [1]


@pytest.mark.usefixtures("no_backoff")
async def test_transient_errors_are_retried_with_numbered_attempts(clock: FakeClock) -> None:
    """Any non-permanent exception is retried; each call knows its attempt number."""
    remote = Remote(clock, failures=3)
    assert await call(remote, clock, attempts=5) == "ok after 4"
    assert remote.calls == [1, 2, 3, 4]


@pytest.mark.usefixtures("no_backoff")
async def test_attempts_bound_the_retries(clock: FakeClock) -> None:
    """At most `attempts` calls; then the last transient error is raised."""
    remote = Remote(clock, failures=100, error=TimeoutError("read timed out"))
    with pytest.raises(TimeoutError, match="read timed out"):
        await call(remote, clock, attempts=4)
    assert remote.calls == [1, 2, 3, 4]


async def test_single_attempt_policy_never_retries(clock: FakeClock) -> None:
    """attempts=1: the first failure is final."""
    remote = Remote(clock, failures=1)
    with pytest.raises(ConnectionError):
        await call(remote, clock, attempts=1)
    assert remote.calls == [1]


async def test_permanent_error_is_never_retried(clock: FakeClock) -> None:
    """PermanentError (S6) goes straight out, whatever attempts are left."""
    remote = Remote(clock, failures=100, error=PermanentError("card declined"))
    with pytest.raises(PermanentError, match="card declined"):
        await call(remote, clock, attempts=10)
    assert remote.calls == [1]


@pytest.mark.usefixtures("no_backoff")
async def test_permanent_error_after_transient_ones_stops_retrying(clock: FakeClock) -> None:
    """A PermanentError on a retry also ends the retrying at once."""
    errors: list[Exception] = [ConnectionError("down"), PermanentError("4xx")]
    calls: list[int] = []

    async def remote(attempt: int) -> str:
        calls.append(attempt)
        raise errors[min(attempt, 2) - 1]

    with pytest.raises(PermanentError):
        await call_with_retries(remote, policy=RetryPolicy(attempts=10),
                                breaker=breaker_for(clock), deadline=1e12, clock=clock)
    assert calls == [1, 2]


@pytest.mark.usefixtures("no_backoff")
async def test_stops_at_the_deadline_with_attempts_left(clock: FakeClock) -> None:
    """Once the clock reaches the deadline no further attempt is started."""
    remote = Remote(clock, failures=100, cost=1.0)
    with pytest.raises(ConnectionError):
        await call(remote, clock, attempts=10, deadline=clock.now + 2.5)
    # calls start at +0, +1, +2; at +3 the deadline (+2.5) has passed
    assert remote.calls == [1, 2, 3]


@pytest.mark.usefixtures("with_backoff")
async def test_does_not_start_a_wait_that_would_end_past_the_deadline(
        clock: FakeClock) -> None:
    """A 60 s backoff with 0.5 s left: give up now instead of sleeping past complete-by."""
    remote = Remote(clock, failures=100)
    with pytest.raises(ConnectionError):
        # had it started the 60 s wait, the guard would end it: nothing was slept
        async with asyncio.timeout(30):
            await call(remote, clock, attempts=10, deadline=clock.now + 0.5,
                       initial_wait=60.0, max_wait=60.0)
    # the first retry is immediate; the wait before the third call would cross the deadline
    assert remote.calls == [1, 2]


@pytest.mark.usefixtures("with_backoff")
async def test_backs_off_between_retries(clock: FakeClock) -> None:
    """Without the testing switch, retries wait (exponential: 10 ms, then 20 ms)."""
    remote = Remote(clock, failures=3)
    started = time.monotonic()
    assert await call(remote, clock, attempts=4, initial_wait=0.01) == "ok after 4"
    assert time.monotonic() - started >= 0.01 + 0.02


async def test_an_open_breaker_fails_attempts_fast_without_calling(clock: FakeClock) -> None:
    """Once the breaker opens, the remaining attempts raise CircuitOpenError, uncalled."""
    breaker = breaker_for(clock, threshold=2)
    remote = Remote(clock, failures=100)
    with pytest.raises(CircuitOpenError):
        await call(remote, clock, attempts=5, breaker=breaker, initial_wait=0.0)
    assert remote.calls == [1, 2]
    assert state_of(breaker) is BreakerState.OPEN


async def test_permanent_errors_do_not_open_the_breaker(clock: FakeClock) -> None:
    """A PermanentError means the service answered: it never counts as a breaker failure."""
    breaker = breaker_for(clock, threshold=2)
    for _ in range(5):
        remote = Remote(clock, failures=1, error=PermanentError("card declined"))
        with pytest.raises(PermanentError):
            await call(remote, clock, breaker=breaker)
    assert state_of(breaker) is BreakerState.CLOSED


async def test_a_success_closes_a_half_open_breaker(clock: FakeClock) -> None:
    """The retry loop's probe call closes the breaker when the service is back."""
    breaker = breaker_for(clock, threshold=1)
    with pytest.raises(ConnectionError):
        await call(Remote(clock, failures=1), clock, attempts=1, breaker=breaker)
    assert state_of(breaker) is BreakerState.OPEN
    clock.now += 5.0
    assert await call(Remote(clock), clock, breaker=breaker) == "ok after 1"
    assert state_of(breaker) is BreakerState.CLOSED


async def test_cancelling_a_probe_frees_the_half_open_slot(clock: FakeClock) -> None:
    """A probe cancelled at the deadline neither opens nor closes the breaker."""
    breaker = breaker_for(clock, threshold=1)
    with pytest.raises(ConnectionError):
        await call(Remote(clock, failures=1), clock, attempts=1, breaker=breaker)
    clock.now += 5.0
    hang, probing = asyncio.Event(), asyncio.Event()

    async def slow(attempt: int) -> str:
        probing.set()  # the probe holds the half-open slot from here
        await hang.wait()
        return "late"

    probe = asyncio.ensure_future(call_with_retries(
        slow, policy=RetryPolicy(attempts=1), breaker=breaker, deadline=1e12, clock=clock))
    async with asyncio.timeout(30):
        await probing.wait()
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert await call(Remote(clock), clock, breaker=breaker) == "ok after 1"


@pytest.mark.parametrize("settings", [{"attempts": 0}, {"initial_wait": -1.0},
                                      {"max_wait": -1.0}, {"jitter": -0.1}])
def test_bad_policy_is_refused(settings: dict[str, float]) -> None:
    """A policy needs at least one attempt and non-negative waits."""
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryPolicy(**settings)  # type: ignore[arg-type]  # bad values on purpose
