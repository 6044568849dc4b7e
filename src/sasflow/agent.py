"""Agents: the code that calls ONE remote service, and the runtime that serves it.

An agent consumes its request queue; for each request it calls the remote
service with retries and a circuit breaker, all before the step's complete-by
(S3), passing the step's stable idempotency key on every attempt. Then:

- success -> a reply with the result;
- PermanentError -> an error reply at once (S6);
- transient failures until the attempts run out -> a "gave up" reply, so the
  failure is counted now rather than at the deadline;
- the complete-by passes -> it stops and sends NOTHING, not even an error (S5):
  another instance may already be running the step again. An `async def` is
  cancelled; a sync function in a thread cannot be (its result is dropped), one
  in a worker process (`isolation="process"`, isolation.py) is killed.

The function runs once per delivery of a request (R3): nothing after the call
makes the request come again. A result over the transport's message limit, or
without a JSON form, is a permanent error reply naming why; a reply the
transport refuses until the complete-by is logged once and dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from sasflow import tracing
from sasflow.breaker import CircuitBreaker
from sasflow.errors import ConfigurationError, PayloadError, PermanentError, TransportError
from sasflow.isolation import ISOLATIONS, FunctionRef, Isolation, ProcessPool
from sasflow.logs import log_context
from sasflow.messages import Reply, Request, decode_request, encode_within, refuse_non_finite
from sasflow.model import Phase
from sasflow.resilience import RetryPolicy, call_with_retries
from sasflow.testing import failpoints
from sasflow.transport.base import Transport, agent_queue
from sasflow.transport.dead_letter import decoded

if TYPE_CHECKING:
    from sasflow.metrics import AgentMetrics, Metrics

__all__ = ["AgentFunction", "AgentRequest", "AgentRuntime"]

log = logging.getLogger("sasflow.agent")

# Stop this long before the complete-by: a reply that arrives after it is useless.
DEADLINE_MARGIN = 0.005
# An error reply's text is cut to this many characters (an HTTP error body can be
# megabytes): it travels in a reply, and lands in the store and in an alert.
_MAX_ERROR_CHARS = 2000
# Longest wait between two tries to send a reply the transport refused.
_MAX_SEND_PAUSE = 1.0


class AgentRequest:
    """What an agent function receives (CONTRACT: req.task_id, req.step, ...).

    Its deadline is judged on `clock`, the state store's clock (R1): the
    complete-by was set on it, so a host whose own clock is off still gets the
    true time left.
    """

    __slots__ = ("_clock", "_message", "attempt")

    def __init__(self, message: Request, attempt: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._message = message
        self.attempt = attempt  # 1, 2, ... within this dispatch of the step
        self._clock = clock

    @property
    def task_id(self) -> str:
        return self._message.task_id

    @property
    def step(self) -> str:
        return self._message.step

    @property
    def input(self) -> Any:
        """The task's input, as submitted (any JSON value)."""
        return self._message.input

    @property
    def results(self) -> dict[str, Any]:
        """The earlier steps' results, by step name."""
        return self._message.results

    @property
    def result(self) -> Any:
        """For a compensator: the result of the step it undoes (else None)."""
        return self._message.result

    @property
    def idempotency_key(self) -> str:
        """Stable for the step across every attempt and every redelivery."""
        return self._message.idempotency_key

    @property
    def compensating(self) -> bool:
        """True when this call is a compensator's (undoing the step)."""
        return self._message.phase is Phase.UNDO

    @property
    def complete_by(self) -> datetime:
        """The complete-by as a time on this host's clock: `complete_by - datetime.now(UTC)`
        is the time left even when this host's clock is off (R1)."""
        if self._clock is time.time:  # the store's clock is this host's: nothing to shift
            return datetime.fromtimestamp(self._message.complete_by, UTC)
        left = self._message.complete_by - self._clock()
        return datetime.fromtimestamp(time.time() + left, UTC)

    def remaining(self) -> float:
        """Seconds left before the complete-by, on the store's clock (use it as a timeout
        for remote calls)."""
        return max(0.0, self._message.complete_by - self._clock())

    def __repr__(self) -> str:
        return f"AgentRequest(task_id={self.task_id!r}, step={self.step!r}, attempt={self.attempt})"


@dataclass(eq=False)
class AgentFunction:
    """An agent declared with ``@app.agent(name)``; still callable as the function."""

    name: str
    handler: Callable[[AgentRequest], Any]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    failure_threshold: int = 5
    reset_timeout: float = 5.0
    concurrency: int = 256
    undo: Callable[[AgentRequest], Any] | None = None
    # where a sync function runs: "thread" (cannot be stopped at the complete-by) or
    # "process" (killed at it); see isolation.py
    isolation: Isolation = "thread"

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ConfigurationError(
                f"agent {self.name!r}: isolation must be one of {', '.join(ISOLATIONS)},"
                f" got {self.isolation!r}", agent=self.name)
        if self.isolation == "process":
            FunctionRef.of(self.handler, agent=self.name)

    def __call__(self, req: AgentRequest) -> Any:
        return self.handler(req)

    def compensator(self, fn: Callable[[AgentRequest], Any]) -> Callable[[AgentRequest], Any]:
        """Declare the undo of this agent's work (S9); `req.result` is what it returned."""
        if self.undo is not None:
            raise ConfigurationError(f"agent {self.name!r} already has a compensator",
                                     agent=self.name)
        if self.isolation == "process":
            FunctionRef.of(fn, agent=self.name)
        self.undo = fn
        return fn


class AgentRuntime:
    """Serves the request queues of some agents in this process.

    `clock` must be the state store's (`store.now`, as Worker passes it): every
    complete-by was set on that clock, and is judged on it (R1).
    """

    def __init__(self, transport: Transport, agents: list[AgentFunction], *,
                 clock: Callable[[], float] = time.time, metrics: Metrics | None = None) -> None:
        self.transport = transport
        self.agents = {a.name: a for a in agents}
        self.clock = clock
        # empty unless metrics are on (metrics.py): each request is then timed, retries counted
        self._metered: dict[str, AgentMetrics] = {} if metrics is None else {
            a.name: metrics.agent(a.name) for a in agents}
        self._tracing = tracing.configured()  # None unless a tracer provider is set up
        self.breakers = {a.name: CircuitBreaker(a.name, failure_threshold=a.failure_threshold,
                                                reset_timeout=a.reset_timeout)
                         for a in agents}
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=64, thread_name_prefix="sasflow-agent")
        self._processes = {
            a.name: ProcessPool(a.name, a.concurrency, preload=[
                FunctionRef.of(fn, agent=a.name) for fn in (a.handler, a.undo) if fn])
            for a in agents if a.isolation == "process"}

    async def run(self) -> None:
        """Consume every served agent's queue until cancelled."""
        for pool in self._processes.values():
            pool.warm()
        try:
            async with asyncio.TaskGroup() as group:
                for agent in self.agents.values():
                    group.create_task(self.transport.consume(
                        agent_queue(agent.name), self._handler(agent),
                        prefetch=agent.concurrency))
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)
            for pool in self._processes.values():
                await pool.close()

    def _handler(self, agent: AgentFunction) -> Callable[[bytes], Any]:
        async def handle(body: bytes) -> None:
            # a body that is no request is a dead letter at once (R3): kept, not dropped
            request = decoded(decode_request, body, f"request for {agent.name}")
            # every record logged while it is handled, the agent's own included, names it
            with log_context(task_id=request.task_id, step=request.step, epoch=request.epoch):
                await self.handle(agent, request)
        return handle

    async def handle(self, agent: AgentFunction, request: Request) -> None:
        fn = agent.handler if request.phase is Phase.DO else agent.undo
        if fn is None:  # a compensation for an agent with none: nothing to undo
            await self._reply(request, ok=True)
            return
        budget = request.complete_by - DEADLINE_MARGIN - self.clock()
        if budget <= 0:  # already too late: silence (S5), but say so here once
            log.warning("%s %s/%s (epoch %d): not started: its complete-by passed %.3fs ago"
                        " on the store's clock", agent.name, request.task_id, request.step,
                        request.epoch, DEADLINE_MARGIN - budget)
            return
        call = self._caller(agent, fn, request)
        # each call in a span, in the task's trace; a task whose trace the sampler drops
        # (as most are) pays a lookup here, unless its scheduler left a traceparent
        if self._tracing is not None and (request.trace or self._tracing.kept(request.task_id)):
            call = self._tracing.calls(call, agent.name, request)
        if failpoints.ARMED: await failpoints.hit("agent.before_call")  # noqa: E701
        metered: AgentMetrics | _Unmetered = self._metered.get(agent.name, _UNMETERED)
        retrying = call_with_retries(
            call, policy=agent.retry, breaker=self.breakers[agent.name],
            deadline=request.complete_by - DEADLINE_MARGIN, clock=self.clock,
            on_retry=metered.retried)
        started = time.perf_counter()  # (timed here, with no coroutine around the calls)
        deadline = asyncio.timeout(budget)
        try:
            async with deadline:
                result = await retrying
        except asyncio.CancelledError:  # the worker stops
            metered.took("deadline", started)
            raise
        except TimeoutError as error:
            if deadline.expired():
                metered.took("deadline", started)
                log.info("%s %s/%s: complete-by passed, falling silent", agent.name,
                         request.task_id, request.step)
                return
            # the remote's own (a socket's read timing out): a failure like any other
            await self._gave_up(agent, request, error, metered, started)
            return
        except PermanentError as error:
            metered.took("permanent", started)
            await self._reply(request, ok=False, error=str(error) or type(error).__name__,
                              permanent=True)
            return
        except Exception as error:
            await self._gave_up(agent, request, error, metered, started)
            return
        metered.took("ok", started)
        if failpoints.ARMED: await failpoints.hit("agent.after_call")  # noqa: E701
        await self._reply(request, ok=True, result=result)

    async def _gave_up(self, agent: AgentFunction, request: Request, error: Exception,
                       metered: AgentMetrics | _Unmetered, started: float) -> None:
        """The calls failed, retries and all: the unit's error replied (transient)."""
        metered.took("transient", started)
        log.info("%s %s/%s: giving up: %r", agent.name, request.task_id, request.step, error)
        await self._reply(request, ok=False, error=f"{type(error).__name__}: {error}")

    def _caller(self, agent: AgentFunction, fn: Callable[[AgentRequest], Any],
                request: Request) -> Callable[[int], Any]:
        """Attempt `n` of `fn` on `request`: on the loop, in a worker process, or in a thread."""
        if inspect.iscoroutinefunction(fn):
            async def call_async(n: int) -> Any:
                return await fn(AgentRequest(request, n, self.clock))
            return call_async
        pool = self._processes.get(agent.name)
        if pool is not None:
            ref = FunctionRef.of(fn, agent=agent.name)

            async def call_in_process(n: int) -> Any:
                # killed at the deadline: nothing of the call happens after it (S5)
                return await pool.call(ref, request, n)
            return call_in_process
        loop = asyncio.get_running_loop()

        async def call_in_thread(n: int) -> Any:
            # a thread cannot be stopped: at the deadline its result is just dropped.
            # It runs in a copy of this context, so that what it logs names its request
            # and what it calls joins its trace (the call's span is current, tracing.py)
            return await loop.run_in_executor(self._threads, contextvars.copy_context().run,
                                              fn, AgentRequest(request, n, self.clock))
        return call_in_thread

    async def _reply(self, request: Request, *, ok: bool, result: Any = None,
                     error: str | None = None, permanent: bool = False) -> None:
        """Send the unit's reply. Never raises: the request is settled whatever happens.

        A request handled again would call the remote service again (R3), so a
        reply that cannot be made or sent is not the request's fault: a result
        that does not fit in a message, or has no JSON form, becomes a permanent
        error reply saying so; a reply the transport will not take is logged
        once and dropped, and the step is recovered at its complete-by like any
        lost reply (the remote deduplicating by the idempotency key).
        """
        reply = Reply(task_id=request.task_id, step=request.step, phase=request.phase,
                      epoch=request.epoch, ok=ok, result=result, error=_clip(error),
                      permanent=permanent)
        limit = self.transport.max_message_bytes
        try:
            try:
                body = encode_within(reply, limit, what="result")
                if b"null" in body:
                    refuse_non_finite(result)
            except (TypeError, msgspec.EncodeError) as exc:
                body = encode_within(self._refusal(
                    request, f"result is not JSON-serialisable: {exc}"), limit, what="reply")
            except PayloadError as exc:
                body = encode_within(self._refusal(request, str(exc)), limit, what="reply")
        except PayloadError as exc:  # even the refusal does not fit: the limit is absurd
            log.error("%s/%s: no reply can be sent: %s", request.task_id, request.step, exc)
            return
        if failpoints.ARMED: await failpoints.hit("agent.before_reply")  # noqa: E701
        await self._send(request, body)

    @staticmethod
    def _refusal(request: Request, error: str) -> Reply:
        """The permanent error reply that stands for a result that cannot be sent."""
        log.error("%s/%s: %s", request.task_id, request.step, error)
        return Reply(task_id=request.task_id, step=request.step, phase=request.phase,
                     epoch=request.epoch, ok=False, permanent=True, error=error)

    async def _send(self, request: Request, body: bytes) -> None:
        """Publish a reply, retrying a transport fault while the complete-by allows.

        A reply after the complete-by would be useless (the scheduler has stopped
        waiting) and is not sent (S5).
        """
        pause = 0.05
        while True:
            try:
                await self.transport.publish(request.reply_to, body)
                return
            except TransportError as error:
                if self.clock() + pause >= request.complete_by - DEADLINE_MARGIN:
                    log.error("%s/%s: reply not sent, the step will be recovered after its"
                              " complete-by: %s", request.task_id, request.step, error)
                    return
            except Exception:  # not a transport fault: trying again would not help
                log.exception("%s/%s: reply not sent, the step will be recovered after its"
                              " complete-by", request.task_id, request.step)
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_SEND_PAUSE)


def _clip(error: str | None) -> str | None:
    """An error's text, cut to a size that a reply, the store and an alert can carry."""
    if error is None or len(error) <= _MAX_ERROR_CHARS:
        return error
    return f"{error[:_MAX_ERROR_CHARS]}... ({len(error) - _MAX_ERROR_CHARS} more characters)"


class _Unmetered:
    """An agent's metrics while metrics are off (metrics.py is not even imported):
    a request then costs one call that does nothing."""

    __slots__ = ()
    retried = None

    def took(self, outcome: str, started: float) -> None:
        pass


_UNMETERED = _Unmetered()
