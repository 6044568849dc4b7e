"""Tracing's own parts (tracing.py), on the SDK's in-memory exporter: a task's trace id,
an attempt's span and its outcome, an agent call's span, when tracing is off, and the
request's `trace` field read by readers older and newer than it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from sasflow import tracing
from sasflow.errors import PermanentError, StoreError
from sasflow.messages import Reply, Request, decode_request, encode
from sasflow.model import CompensationRecord, Phase, StepRecord, StepState, Task, TaskState
from sasflow.tracing import Tracing, trace_id_of
from support.tracing import Spans, install_provider, remove_provider

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Spans:
    return install_provider(monkeypatch)


@pytest.fixture
def tracer(spans: Spans) -> Tracing:
    configured = tracing.configured()
    assert configured is not None
    return configured


def a_task(phase: Phase = Phase.DO) -> Task:
    undoing = phase is Phase.UNDO
    reserve = StepRecord(
        name="reserve", agent="inventory",
        state=StepState.COMPENSATING if undoing else StepState.RUNNING, attempts=2,
        compensation=CompensationRecord(state=StepState.RUNNING, attempts=1) if undoing
        else None)
    return Task(task_id="order-7", workflow="process-order", input={"order_id": 7},
                state=TaskState.COMPENSATING if undoing else TaskState.PROCESSING,
                phase=phase, locked_by="w1", epoch=3, steps=[reserve])


def a_request(**fields: Any) -> Request:
    values: dict[str, Any] = dict(
        task_id="order-7", step="reserve", phase=Phase.DO, agent="inventory", epoch=3,
        input={"order_id": 7}, results={}, idempotency_key="k-1", complete_by=1e9,
        reply_to="sasflow.reply.w1")
    return Request(**{**values, **fields})


def a_reply(ok: bool, error: str | None = None, permanent: bool = False) -> Reply:
    return Reply(task_id="order-7", step="reserve", phase=Phase.DO, epoch=3, ok=ok,
                 error=error, permanent=permanent)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def status(span: ReadableSpan) -> tuple[trace.StatusCode, str | None]:
    return span.status.status_code, span.status.description


# ---------------------------------------------------------------- the trace id


def test_a_tasks_trace_id_is_the_first_16_bytes_of_the_sha256_of_its_id() -> None:
    """Any process finds the same trace from the task id alone; another task, another."""
    assert trace_id_of("order-42") == hashlib.sha256(b"order-42").hexdigest()[:32]
    assert trace_id_of("order-42") != trace_id_of("order-43")
    assert re.fullmatch("[0-9a-f]{32}", trace_id_of("commande-été"))


# ---------------------------------------------------------------- on or off


def test_tracing_is_off_without_a_tracer_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    remove_provider(monkeypatch)
    assert tracing.configured() is None


def test_tracing_is_off_without_the_opentelemetry_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extra not installed (its import fails) is tracing off, whatever the environment
    says."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    assert tracing.configured() is None


def test_tracing_is_on_once_a_tracer_provider_is_configured(spans: Spans) -> None:
    assert isinstance(tracing.configured(), Tracing)


def test_a_process_that_traces_nothing_never_imports_opentelemetry() -> None:
    """A worker's actors ask, and nothing made them import the API (~35 ms a process)."""
    script = ("import sys\n"
              "from sasflow import App, tracing\n"
              "assert tracing.configured() is None\n"
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------- an attempt's span


def test_an_attempt_span_is_in_the_tasks_trace_and_its_traceparent_goes_in_the_request(
        spans: Spans, tracer: Tracing) -> None:
    """Named after the step, under the task's own (remote) span, with the attempt's
    attributes; the request carries its W3C traceparent."""
    request = a_request()
    with tracer.attempt(a_task(), request) as attempt:
        attempt.replied(a_reply(ok=True))
    [span] = spans.all()
    assert (span.name, span.kind) == ("reserve", trace.SpanKind.CLIENT)
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == trace_id_of("order-7")
    assert (span.parent.trace_id, span.parent.is_remote) == (span.context.trace_id, True)
    assert attributes(span) == {
        "sasflow.task_id": "order-7", "sasflow.workflow": "process-order",
        "sasflow.step": "reserve", "sasflow.agent": "inventory", "sasflow.attempt": 2,
        "sasflow.epoch": 3, "sasflow.phase": "do", "sasflow.outcome": "completed"}
    assert status(span) == (trace.StatusCode.UNSET, None)
    assert request.trace == (f"00-{trace_id_of('order-7')}-{span.context.span_id:016x}-01")


@pytest.mark.parametrize(("reply", "outcome", "description"), [
    (a_reply(ok=False, error="card declined", permanent=True), "failed", "card declined"),
    (a_reply(ok=False, error="RuntimeError: down"), "gave_up", "RuntimeError: down"),
    (None, "expired", "no reply by the complete-by"),
], ids=["failed", "gave_up", "expired"])
def test_a_failed_attempt_has_status_error_and_the_errors_text(
        spans: Spans, tracer: Tracing, reply: Reply | None, outcome: str,
        description: str) -> None:
    with tracer.attempt(a_task(), a_request()) as attempt:
        attempt.replied(reply)
    [span] = spans.all()
    assert attributes(span)["sasflow.outcome"] == outcome
    assert status(span) == (trace.StatusCode.ERROR, description)


def test_an_attempt_whose_reply_was_not_applied_was_taken_away(
        spans: Spans, tracer: Tracing) -> None:
    with tracer.attempt(a_task(), a_request()) as attempt:
        attempt.replied(a_reply(ok=True))
        attempt.taken_away()
    [span] = spans.all()
    assert attributes(span)["sasflow.outcome"] == "taken_away"


def test_an_attempt_the_store_failed_records_the_exception(
        spans: Spans, tracer: Tracing) -> None:
    with pytest.raises(StoreError), tracer.attempt(a_task(), a_request()):
        raise StoreError("database is locked")
    [span] = spans.all()
    assert attributes(span)["sasflow.outcome"] == "error"
    assert status(span) == (trace.StatusCode.ERROR, "StoreError: database is locked")
    [event] = span.events
    assert (event.name, dict(event.attributes or {})["exception.type"]) == (
        "exception", "sasflow.errors.StoreError")


def test_an_attempt_cut_short_by_a_stop_is_stopped_not_failed(
        spans: Spans, tracer: Tracing) -> None:
    with pytest.raises(asyncio.CancelledError), tracer.attempt(a_task(), a_request()):
        raise asyncio.CancelledError
    [span] = spans.all()
    assert attributes(span)["sasflow.outcome"] == "stopped"
    assert status(span) == (trace.StatusCode.UNSET, None)


def test_a_compensation_attempt_is_an_undo_span_counting_the_compensations_attempts(
        spans: Spans, tracer: Tracing) -> None:
    with tracer.attempt(a_task(Phase.UNDO), a_request(phase=Phase.UNDO)) as attempt:
        attempt.replied(a_reply(ok=True))
    [span] = spans.all()
    assert span.name == "undo reserve"
    assert (attributes(span)["sasflow.phase"], attributes(span)["sasflow.attempt"]) == (
        "undo", 1)


def test_the_attempt_span_is_current_while_it_runs(tracer: Tracing) -> None:
    """So an instrumented broker or database client nests its spans under it."""
    before = trace.get_current_span()
    with tracer.attempt(a_task(), a_request()):
        inside = trace.get_current_span()
    assert inside is not before and inside.get_span_context().trace_id == int(
        trace_id_of("order-7"), 16)
    assert trace.get_current_span() is before


async def test_a_ratio_sampler_keeps_or_drops_each_tasks_spans_all_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ParentBased(TraceIdRatioBased(0.5)), the task's trace is kept or dropped as
    the ratio decides by its trace id: its attempt and the agent's call alike."""
    ratio = TraceIdRatioBased(0.5)
    spans = install_provider(monkeypatch, ParentBased(ratio))
    configured = tracing.configured()
    assert configured is not None
    kept: list[str] = []
    for n in range(40):
        task = msgspec.structs.replace(a_task(), task_id=f"order-{n}")
        request = a_request(task_id=task.task_id)
        with configured.attempt(task, request) as attempt:
            attempt.replied(a_reply(ok=True))
        await configured.calls(_ok, "inventory", request)(1)
        decided = ratio.should_sample(None, int(trace_id_of(task.task_id), 16), "t")
        if decided.decision is Decision.RECORD_AND_SAMPLE:
            kept.append(task.task_id)
        else:  # a dropped task costs no span, and its request carries no traceparent
            assert request.trace is None
    assert 5 < len(kept) < 35  # the ratio kept some tasks and dropped others
    for task_id in (f"order-{n}" for n in range(40)):
        expected = 1 if task_id in kept else 0
        assert len(spans.attempts(task_id)) == expected, task_id
        assert len(spans.agent_calls(task_id)) == expected, task_id


async def _ok(n: int) -> str:
    return "ok"


async def test_a_process_asks_the_sampler_once_a_task_and_drops_it_without_a_span(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every actor of a process (here a scheduler's Tracing and an agent's) shares the
    sampler's decision on a task: asked at its first attempt, not again at its agent call
    or its next attempts. A dropped task's attempt is None (`attempt_span`): a
    scheduler runs it as with tracing off."""
    asked: list[int] = []

    class Counting(TraceIdRatioBased):
        def should_sample(self, parent_context: Any, trace_id: int, *args: Any,
                          **kwargs: Any) -> Any:
            asked.append(trace_id)
            return super().should_sample(parent_context, trace_id, *args, **kwargs)

    spans = install_provider(monkeypatch, ParentBased(Counting(0.0)))
    scheduler_side, agent_side = tracing.configured(), tracing.configured()
    assert scheduler_side is not None and agent_side is not None
    for n in range(3):
        task = msgspec.structs.replace(a_task(), task_id=f"order-{n}")
        request = a_request(task_id=task.task_id)
        for _ in range(2):  # two attempts at the step, each with its agent call
            assert scheduler_side.attempt_span(task, request) is None
            with scheduler_side.attempt(task, request) as attempt:  # the same, entered
                attempt.replied(a_reply(ok=True))
            await agent_side.calls(_ok, "inventory", request)(1)
    assert asked == [int(trace_id_of(f"order-{n}"), 16) for n in range(3)]
    assert not spans.all()


class _Odd(TraceIdRatioBased):
    """A sampler of the application's own (here: keeps the odd trace ids)."""

    def should_sample(self, parent_context: Any, trace_id: int, *args: Any,
                      **kwargs: Any) -> Any:
        return super().should_sample(parent_context, trace_id | 1 if trace_id % 2 else 0,
                                     *args, **kwargs)


@pytest.mark.parametrize("sampler", [
    ParentBased(TraceIdRatioBased(0.01)), ParentBased(TraceIdRatioBased(0.5)),
    TraceIdRatioBased(0.3), ALWAYS_ON, ALWAYS_OFF, DEFAULT_ON, ParentBased(ALWAYS_OFF),
    ParentBased(_Odd(1.0)), _Odd(1.0)], ids=[
    "parent-ratio-0.01", "parent-ratio-0.5", "ratio-0.3", "always-on", "always-off",
    "default-on", "parent-always-off", "parent-own", "own"])
def test_a_tasks_decision_is_the_samplers_own_for_a_root_span(sampler: Sampler) -> None:
    """The SDK's samplers are read rather than called (tracing._root_decision); for
    2,000 tasks the decision is what the sampler itself gives a root span of the
    task's trace, and a sampler of the application's own is asked."""
    kept = tracing._task_sampler(TracerProvider(sampler=sampler))
    ids = [f"task-{n}" for n in range(2000)]
    expected = [sampler.should_sample(Context(), int(trace_id_of(i), 16), "t").decision
                is Decision.RECORD_AND_SAMPLE for i in ids]
    assert [kept(i) for i in ids] == expected


def test_a_tasks_decision_does_not_follow_the_span_current_where_it_is_asked() -> None:
    """Asked while a sampled span is current (a web request's, say), a ParentBased
    sampler would follow it as a parent: the task's decision is its root's, here to
    drop every task, in whatever context its first attempt happens to run."""
    kept = tracing._task_sampler(TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0))))
    outer = TracerProvider().get_tracer("test").start_span("request")
    assert outer.get_span_context().trace_flags.sampled
    with trace.use_span(outer, end_on_exit=True):
        assert not any(kept(f"task-{n}") for n in range(200))


# ---------------------------------------------------------------- an agent call's span


async def test_an_agent_call_is_a_child_of_the_attempt_span_and_current_while_it_runs(
        spans: Spans, tracer: Tracing) -> None:
    request = a_request()
    with tracer.attempt(a_task(), request) as attempt:
        attempt.replied(a_reply(ok=True))
    seen: list[trace.Span] = []

    async def call(n: int) -> str:
        seen.append(trace.get_current_span())
        return "reserved"

    assert await tracer.calls(call, "inventory", request)(1) == "reserved"
    attempt_span, agent_span = spans.all()
    assert agent_span.context is not None and attempt_span.context is not None
    assert agent_span.parent is not None
    assert (agent_span.name, agent_span.kind) == ("agent inventory", trace.SpanKind.SERVER)
    assert agent_span.parent.span_id == attempt_span.context.span_id
    assert agent_span.context.trace_id == attempt_span.context.trace_id
    assert seen[0].get_span_context().span_id == agent_span.context.span_id
    assert attributes(agent_span) == {
        "sasflow.task_id": "order-7", "sasflow.step": "reserve", "sasflow.agent": "inventory",
        "sasflow.epoch": 3, "sasflow.phase": "do", "sasflow.call": 1}


async def test_an_agent_handed_no_traceparent_puts_its_span_under_the_tasks(
        spans: Spans, tracer: Tracing) -> None:
    """A scheduler with tracing off: the agent's span still joins the task's trace, beside
    where the attempt spans would be."""
    with tracer.attempt(a_task(), a_request()) as attempt:
        attempt.replied(a_reply(ok=True))

    async def call(n: int) -> None:
        return None

    await tracer.calls(call, "inventory", a_request())(1)
    attempt_span, agent_span = spans.all()
    assert agent_span.parent is not None and attempt_span.parent is not None
    assert agent_span.parent == attempt_span.parent


async def test_a_failed_agent_call_has_status_error_and_records_the_exception(
        spans: Spans, tracer: Tracing) -> None:
    async def call(n: int) -> None:
        raise PermanentError("card declined")

    with pytest.raises(PermanentError):
        await tracer.calls(call, "payments", a_request(trace=TRACEPARENT))(2)
    [span] = spans.all()
    assert status(span) == (trace.StatusCode.ERROR, "PermanentError: card declined")
    assert [event.name for event in span.events] == ["exception"]
    assert span.parent is not None and span.parent.trace_id == int(TRACEPARENT[3:35], 16)
    assert attributes(span)["sasflow.call"] == 2


# ---------------------------------------------------------------- the request's field


class RequestBefore(msgspec.Struct, kw_only=True, omit_defaults=True):
    """messages.Request as it was before its `trace` field: what an older reader has."""

    task_id: str
    step: str
    phase: Phase
    agent: str
    epoch: int
    input: Any
    results: dict[str, Any]
    idempotency_key: str
    complete_by: float
    reply_to: str
    result: Any = None


def before(request: Request) -> RequestBefore:
    return RequestBefore(**{name: getattr(request, name)
                            for name in RequestBefore.__struct_fields__})


def test_a_request_without_a_trace_is_the_bytes_it_was_before() -> None:
    """Tracing off, the wire is unchanged: not even a `"trace": null`."""
    request = a_request(result={"reserved": 7})
    assert encode(request) == msgspec.json.encode(before(request))
    assert b"trace" not in encode(request)


def test_a_request_with_a_trace_decodes_on_a_reader_that_predates_it() -> None:
    request = a_request(trace=TRACEPARENT)
    body = encode(request)
    assert msgspec.json.decode(body, type=RequestBefore) == before(request)
    assert decode_request(body) == request


def test_a_request_from_a_writer_that_predates_the_trace_decodes_without_one() -> None:
    old = before(a_request())
    request = decode_request(msgspec.json.encode(old))
    assert request.trace is None
    assert before(request) == old
