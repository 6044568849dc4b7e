"""Agents: the code that calls ONE remote service, and the runtime that serves it.

An agent consumes its request queue; for each request it calls the remote
service with retries and a circuit breaker, all before the step's complete-by
(S3), passing the step's stable idempotency key on every attempt. Then:

- success -> a reply with the result;
- PermanentError -> an error reply at once (S6);
- transient failures until the attempts run out -> a "gave up" reply, so the
  failure is counted now rather than at the deadline;
- the complete-by passes -> it stops and sends NOTHING, not even an error (S5):
  another instance may already be running the step again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from sasflow.breaker import CircuitBreaker
from sasflow.errors import ConfigurationError, PermanentError
from sasflow.messages import Reply, Request, decode_request, encode, refuse_non_finite
from sasflow.model import Phase
from sasflow.resilience import RetryPolicy, call_with_retries
from sasflow.transport.base import Transport, agent_queue

__all__ = ["AgentFunction", "AgentRequest", "AgentRuntime"]

log = logging.getLogger("sasflow.agent")

# Stop this long before the complete-by: a reply that arrives after it is useless.
DEADLINE_MARGIN = 0.005


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

    task_id = property(lambda self: self._message.task_id)
    step = property(lambda self: self._message.step)
    input = property(lambda self: self._message.input)
    results = property(lambda self: self._message.results)  # earlier steps', by name
    result = property(lambda self: self._message.result)  # compensators: the step's result
    idempotency_key = property(lambda self: self._message.idempotency_key)
    compensating = property(lambda self: self._message.phase is Phase.UNDO)

    @property
    def complete_by(self) -> datetime:
        """The complete-by as a time on this host's clock: `complete_by - datetime.now(UTC)`
        is the time left even when this host's clock is off (R1)."""
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

    def __call__(self, req: AgentRequest) -> Any:
        return self.handler(req)

    def compensator(self, fn: Callable[[AgentRequest], Any]) -> Callable[[AgentRequest], Any]:
        """Declare the undo of this agent's work (S9); `req.result` is what it returned."""
        if self.undo is not None:
            raise ConfigurationError(f"agent {self.name!r} already has a compensator",
                                     agent=self.name)
        self.undo = fn
        return fn


class AgentRuntime:
    """Serves the request queues of some agents in this process.

    `clock` must be the state store's (`store.now`, as Worker passes it): every
    complete-by was set on that clock, and is judged on it (R1).
    """

    def __init__(self, transport: Transport, agents: list[AgentFunction], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.agents = {a.name: a for a in agents}
        self.clock = clock
        self.breakers = {a.name: CircuitBreaker(a.name, failure_threshold=a.failure_threshold,
                                                reset_timeout=a.reset_timeout)
                         for a in agents}
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=64, thread_name_prefix="sasflow-agent")

    async def run(self) -> None:
        """Consume every served agent's queue until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                for agent in self.agents.values():
                    group.create_task(self.transport.consume(
                        agent_queue(agent.name), self._handler(agent),
                        prefetch=agent.concurrency))
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _handler(self, agent: AgentFunction) -> Callable[[bytes], Any]:
        async def handle(body: bytes) -> None:
            try:
                request = decode_request(body)
            except msgspec.DecodeError as error:  # redelivering it would not help
                log.error("agent %s: dropping a malformed request: %s", agent.name, error)
                return
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
        call = self._caller(fn, request)
        try:
            async with asyncio.timeout(budget):
                result = await call_with_retries(
                    call, policy=agent.retry, breaker=self.breakers[agent.name],
                    deadline=request.complete_by - DEADLINE_MARGIN, clock=self.clock)
        except TimeoutError:
            log.info("%s %s/%s: complete-by passed, falling silent", agent.name,
                     request.task_id, request.step)
            return
        except PermanentError as error:
            await self._reply(request, ok=False, error=str(error) or type(error).__name__,
                              permanent=True)
            return
        except Exception as error:
            log.info("%s %s/%s: giving up: %r", agent.name, request.task_id, request.step, error)
            await self._reply(request, ok=False, error=f"{type(error).__name__}: {error}")
            return
        await self._reply(request, ok=True, result=result)

    def _caller(self, fn: Callable[[AgentRequest], Any], request: Request
                ) -> Callable[[int], Any]:
        if inspect.iscoroutinefunction(fn):
            async def call_async(n: int) -> Any:
                return await fn(AgentRequest(request, n, self.clock))
            return call_async
        loop = asyncio.get_running_loop()

        async def call_in_thread(n: int) -> Any:
            # a thread cannot be stopped: at the deadline its result is just dropped
            return await loop.run_in_executor(self._threads, fn,
                                              AgentRequest(request, n, self.clock))
        return call_in_thread

    async def _reply(self, request: Request, *, ok: bool, result: Any = None,
                     error: str | None = None, permanent: bool = False) -> None:
        reply = Reply(task_id=request.task_id, step=request.step, phase=request.phase,
                      epoch=request.epoch, ok=ok, result=result, error=error,
                      permanent=permanent)
        try:
            body = encode(reply)
            if b"null" in body:
                refuse_non_finite(result)
        except (TypeError, msgspec.EncodeError) as exc:
            reply = Reply(task_id=request.task_id, step=request.step, phase=request.phase,
                          epoch=request.epoch, ok=False, permanent=True,
                          error=f"result is not JSON-serialisable: {exc}")
            body = encode(reply)
        await self.transport.publish(request.reply_to, body)
