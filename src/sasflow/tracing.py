"""OpenTelemetry tracing: one trace per task, whatever processes and restarts it crosses (U5).

A task's trace id is derived from its id (`trace_id_of`: the first 16 bytes of
the SHA-256 of it), so every scheduler and agent that touches the task joins
the same trace with nothing stored, and an operator finds the trace from the
task id. The trace holds::

    (the task)                 no process records it: its span id is derived too
    ├── reserve                a scheduler's attempt at a step: request published .. reply applied
    │   └── agent inventory    one call of the agent's function, current while it runs
    │       └── GET ...        what the function calls through an instrumented client
    ├── charge                 a failed attempt has status ERROR and the error's text
    ├── charge                 ... and its retry, a span of its own
    └── undo reserve           a compensation's attempt (phase undo)

The attempt's span reaches the agent as a W3C ``traceparent`` in the request
(`Request.trace`); an agent handed none (its scheduler traces nothing) puts its
span under the task's.

Off unless the application configured a TracerProvider (OpenTelemetry's
`set_tracer_provider`, or OTEL_PYTHON_TRACER_PROVIDER) before its worker
started: each actor asks `configured()` once, holds the None it gets, and a
step then pays one `is None` check. opentelemetry is imported here only, and
only when something may have configured it: without the `otel` extra sasflow
runs as it would with no tracing at all.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sasflow.messages import Reply, Request
from sasflow.model import Phase, Task

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = ["Attempt", "Tracing", "configured", "trace_id_of"]

# the attributes of sasflow's spans
TASK_ID = "sasflow.task_id"
WORKFLOW = "sasflow.workflow"
STEP = "sasflow.step"
AGENT = "sasflow.agent"
ATTEMPT = "sasflow.attempt"  # the unit's attempt, as the store counts them (1, 2, ...)
EPOCH = "sasflow.epoch"
PHASE = "sasflow.phase"  # "do", or "undo" for a compensation
OUTCOME = "sasflow.outcome"  # an attempt's: see Attempt
CALL = "sasflow.call"  # an agent span's: the call's number within one delivery (retries)

_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"


def trace_id_of(task_id: str) -> str:
    """The id of `task_id`'s trace, as 32 hex digits (what tracing backends search by)."""
    return f"{_trace_id(task_id):032x}"


def _trace_id(task_id: str) -> int:
    """The task's trace id: the first 16 bytes of the SHA-256 of its id."""
    # an all-zero id is invalid; a digest that begins with 16 zero bytes will not occur
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:16]) or 1


def _task_span_id(task_id: str) -> int:
    """The span id of the task itself: the next 8 bytes of the same digest."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[16:24]) or 1


def configured() -> Tracing | None:
    """This process's tracing, or None while no TracerProvider is configured (or the
    OpenTelemetry API is not installed). Each actor asks once, when it is made."""
    if "opentelemetry.trace" not in sys.modules and _PROVIDER_VARIABLE not in os.environ:
        return None  # nothing can have configured one: spare the import (~35 ms)
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return Tracing(provider.get_tracer("sasflow"), _task_sampler(provider))


@functools.lru_cache(maxsize=8)  # one a provider: a process's actors share its decisions
def _task_sampler(provider: Any) -> Callable[[str], bool]:
    """Whether the provider's sampler keeps a task's trace, decided as for a root span
    of its trace id (whatever span is current where it is asked): so a task's spans
    are kept or dropped all together, by the sampler the application chose
    (ParentBased(TraceIdRatioBased(0.01)) keeps 1%).

    Asked at each of a task's attempts and agent calls, by every actor of the
    process: a task's first question decides, the next ones are a lookup."""
    sampler = getattr(provider, "sampler", None)  # the SDK's; another provider decides itself
    if sampler is None:
        return lambda task_id: True
    return functools.lru_cache(maxsize=4096)(_root_decision(sampler))


def _root_decision(sampler: Any) -> Callable[[str], bool]:
    """How `sampler` decides for a root span of a task's trace id.

    The SDK's own samplers (ALWAYS_ON, ALWAYS_OFF and TraceIdRatioBased, alone or
    under ParentBased, whose root decides where there is no parent) are read, not
    called: a call makes a result object and looks the parent up in the context,
    about 30 calls a task where the ratio's comparison is one. Any other sampler,
    a subclass of theirs included, is asked, with an empty context as the parent.
    """
    try:
        from opentelemetry.context import Context
        from opentelemetry.sdk.trace import sampling
    except ImportError:  # a provider of another SDK that has a sampler
        return lambda task_id: True
    root = getattr(sampler, "_root", None) if type(sampler) is sampling.ParentBased else sampler
    if root is sampling.ALWAYS_ON:
        return lambda task_id: True  # (no hash needed)
    if root is sampling.ALWAYS_OFF:
        return lambda task_id: False
    if type(root) is sampling.TraceIdRatioBased:
        bound, limit = root.bound, root.TRACE_ID_LIMIT

        def by_ratio(task_id: str) -> bool:  # what its should_sample compares
            return _trace_id(task_id) & limit < bound
        return by_ratio
    no_parent = Context()
    return lambda task_id: bool(
        sampler.should_sample(no_parent, _trace_id(task_id), "task").decision.is_sampled())


class Tracing:
    """sasflow's spans, made with `tracer`: the schedulers' attempts, the agents' calls."""

    __slots__ = ("kept", "tracer")

    def __init__(self, tracer: Tracer,
                 kept: Callable[[str], bool] = lambda task_id: True) -> None:
        self.tracer = tracer
        self.kept = kept  # whether the sampler keeps the spans of a task's trace (by its id)

    def attempt(self, task: Task, request: Request) -> Attempt:
        """The span of the attempt `request` makes at `task`'s current unit, started now
        (one that records nothing if the sampler drops the task).

        Entered, it becomes current and puts its ``traceparent`` in `request`, to
        be encoded with it; on exit it ends.
        """
        return self.attempt_span(task, request) or _UNTRACED

    def attempt_span(self, task: Task, request: Request) -> Attempt | None:
        """`attempt`, or None if the sampler drops the task: a scheduler then runs the
        attempt as with tracing off (it asks `kept` first, a lookup, and calls this
        only for a task the sampler keeps)."""
        if not self.kept(task.task_id):
            return None  # a task the sampler drops costs no span at all
        from opentelemetry.trace import SpanKind

        record = task.steps[task.cursor]
        undo = request.phase is Phase.UNDO
        unit = record.compensation if undo and record.compensation else record
        span = self.tracer.start_span(
            f"undo {request.step}" if undo else request.step,
            context=_task_context(task.task_id),
            kind=SpanKind.CLIENT, attributes={
                TASK_ID: task.task_id, WORKFLOW: task.workflow, STEP: request.step,
                AGENT: request.agent, ATTEMPT: unit.attempts, EPOCH: request.epoch,
                PHASE: request.phase.value})
        return Attempt(span, request)

    def calls(self, call: Callable[[int], Awaitable[Any]], agent: str,
              request: Request) -> Callable[[int], Awaitable[Any]]:
        """`call`, each of its calls (an agent's tries at `request`) in a span of its own,
        current while it runs: a child of the request's attempt span, or else of the task."""
        if (request.trace.endswith("-00") if request.trace  # its attempt is not sampled
                else not self.kept(request.task_id)):
            return call  # the task's spans are dropped: make none
        from opentelemetry import context
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = (TraceContextTextMapPropagator().extract({"traceparent": request.trace})
                  if request.trace else _task_context(request.task_id))
        name = f"agent {agent}"
        attributes: dict[str, str | int] = {
            TASK_ID: request.task_id, STEP: request.step, AGENT: agent, EPOCH: request.epoch,
            PHASE: request.phase.value}

        async def traced(n: int) -> Any:
            span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER,
                                          attributes={**attributes, CALL: n})
            # current for the function's call: an instrumented client (httpx) it uses
            # makes its spans children of this one. A sync function's thread runs in
            # a copy of this context (agent.py), this span included.
            token = context.attach(set_span_in_context(span, parent))
            try:
                return await call(n)
            except BaseException as error:
                _failed(span, error)
                raise
            finally:
                context.detach(token)
                span.end()
        return traced


class Attempt:
    """One attempt's span, a context manager: from its request's publication to its
    reply applied, or the attempt given up.

    Its outcome (attribute ``sasflow.outcome``): ``completed``; ``failed`` (the
    agent refused for good, or the request was over the message limit);
    ``gave_up`` (the agent ran out of tries); ``expired`` (no reply by the
    complete-by); ``taken_away`` (the task was no longer this scheduler's to
    write); ``error`` (the store or the transport raised); ``stopped`` (the
    scheduler stopped). ``failed``, ``gave_up``, ``expired`` and ``error`` have
    status ERROR with the error's text; ``error`` records the exception too.
    """

    __slots__ = ("_request", "_span", "_token")

    def __init__(self, span: Span, request: Request) -> None:
        self._span = span
        self._request = request

    def __enter__(self) -> Attempt:
        from opentelemetry import context
        from opentelemetry.trace import set_span_in_context

        ids = self._span.get_span_context()
        # W3C trace context, version 00 (what OpenTelemetry's propagator writes, a tenth
        # of its cost): the agent's side reads it with the propagator
        self._request.trace = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
        # current while the scheduler publishes and applies: an instrumented broker or
        # database client's spans nest under the attempt
        self._token = context.attach(set_span_in_context(self._span))
        return self

    def replied(self, reply: Reply | None) -> None:
        """The attempt's reply came (or, None, its complete-by passed without one)."""
        if reply is None:
            self._outcome("expired", "no reply by the complete-by")
        elif reply.ok:
            self._outcome("completed")
        elif reply.permanent:
            self._outcome("failed", reply.error)
        else:
            self._outcome("gave_up", reply.error)

    def taken_away(self) -> None:
        """The reply was not applied: the task was no longer this scheduler's."""
        self._span.set_attribute(OUTCOME, "taken_away")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: object) -> None:
        from opentelemetry import context

        context.detach(self._token)
        if isinstance(error, asyncio.CancelledError):
            self._span.set_attribute(OUTCOME, "stopped")
        elif error is not None:
            self._span.set_attribute(OUTCOME, "error")
            _failed(self._span, error)
        self._span.end()

    def _outcome(self, outcome: str, error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute(OUTCOME, outcome)
        if outcome != "completed":
            self._span.set_status(Status(StatusCode.ERROR, error or outcome))


class _Untraced(Attempt):
    """The attempt of a task whose spans the sampler drops: nothing to record, and no
    traceparent for the agent, which then makes no span either."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def __enter__(self) -> Attempt:
        return self

    def replied(self, reply: Reply | None) -> None:
        pass

    def taken_away(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: object) -> None:
        pass


_UNTRACED = _Untraced()


@functools.lru_cache(maxsize=4096)  # a task's attempts follow one another: 6 µs each saved
def _task_context(task_id: str) -> Context:
    """A context whose current span is the task's own (remote: no process records it),
    so that a span started in it is in the task's trace. Asked only for a task the
    sampler keeps (`Tracing.kept`)."""
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        TraceFlags,
        set_span_in_context,
    )

    trace_id, span_id = _trace_id(task_id), _task_span_id(task_id)
    # flagged sampled, as the sampler decided for a root span of this trace: a
    # ParentBased sampler (the default) then keeps every span of the task, in any process
    return set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))


def _failed(span: Span, error: BaseException) -> None:
    """Mark `span` failed by `error`: status ERROR with its text, the exception recorded."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, asyncio.CancelledError):
        description = "cancelled (the complete-by passed, or the worker stopped)"
    else:
        description = f"{type(error).__name__}: {error}"
        span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, description))
