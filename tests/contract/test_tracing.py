"""Tracing end to end (U5): real workers, their requests crossing the in-process queues or
Redis, spans exported to the SDK's in-memory exporter.

One trace per task, its id derived from the task id: a span per attempt at a step or
a compensation, made by the scheduler; under each, the agent's span around its
function's call (the attempt's traceparent travelled in the request); under that, an
httpx call the function made through OpenTelemetry's httpx instrumentation. With no
tracer provider configured, none of it: no tracer asked for, no traceparent sent.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import ReadableSpan

from sasflow import App, PermanentError, Step
from sasflow.agent import AgentRequest
from sasflow.messages import Request, decode_request
from sasflow.model import TaskState
from sasflow.tracing import TASK_ID, trace_id_of
from sasflow.transport import agent_queue
from support.backends import TRANSPORTS
from support.tracing import Spans, install_provider, remove_provider

HANG_GUARD = 60.0  # only a hang fails on it: no test here is about speed
Attempts = Callable[[str], list[ReadableSpan]]


class Stock:
    """A remote service on loopback that answers every GET, keeping the traceparent
    header each request came with."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        seen = self.traceparents

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("traceparent"))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # not on the test's stderr

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def stock() -> Iterator[Stock]:
    service = Stock()
    thread = threading.Thread(target=service.server.serve_forever, daemon=True)
    thread.start()
    yield service
    service.server.shutdown()
    service.server.server_close()
    thread.join()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Spans:
    return install_provider(monkeypatch)


@pytest.fixture
def http(spans: Spans) -> Iterator[httpx.Client]:
    """An httpx client instrumented as OpenTelemetry's docs say, with the test's provider."""
    client = httpx.Client()
    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=spans.provider)
    yield client
    client.close()


@dataclass
class Shop:
    """reserve (a sync agent calling the stock service over httpx), charge (refused once
    per task with a transient error: its agent tries once, so the step is retried), ship
    (refused for good for an address "nowhere"); reserve and charge can be undone."""

    app: App
    agents: dict[str, str]  # step -> its agent's name, private to the test on a shared broker
    sent: list[tuple[str, Request]] = field(default_factory=list)  # (agent, request) published


def shop(tmp_path: Path, transport: str, stock_url: str | None = None,
         http: httpx.Client | None = None) -> Shop:
    app = App(store=f"sqlite:///{tmp_path / 'shop.db'}", transport=transport)
    run = uuid.uuid4().hex[:8]
    made = Shop(app, {step: f"{step}-{run}" for step in ("reserve", "charge", "ship")})
    refused_once: set[str] = set()

    @app.agent(made.agents["reserve"])
    def reserve(req: AgentRequest) -> dict[str, Any]:
        if http is not None:
            http.get(f"{stock_url}/items/{req.input['item']}", timeout=req.remaining()
                     ).raise_for_status()
        return {"reserved": req.input["item"]}

    @reserve.compensator
    def release(req: AgentRequest) -> None:
        return None

    @app.agent(made.agents["charge"], attempts=1)
    async def charge(req: AgentRequest) -> str:
        if req.task_id not in refused_once:
            refused_once.add(req.task_id)
            raise ConnectionError("payment service unreachable")
        return "charged"

    @charge.compensator
    async def refund(req: AgentRequest) -> None:
        return None

    @app.agent(made.agents["ship"])
    async def ship(req: AgentRequest) -> str:
        if req.input.get("address") == "nowhere":
            raise PermanentError("no such address")
        return "shipped"

    app.workflow("order", steps=[Step(step, agent=agent, timeout=HANG_GUARD)
                                 for step, agent in made.agents.items()],
                 max_failures=3, retry_backoff=0.0, on_failure="compensate")
    return made


def record_requests(made: Shop) -> None:
    """Keep every request the app's transport publishes to an agent, as it travels."""
    transport = made.app._transport
    queues = {agent_queue(agent): agent for agent in made.agents.values()}
    publish = transport.publish

    async def recording(queue: str, body: bytes) -> None:
        if queue in queues:
            made.sent.append((queues[queue], decode_request(body)))
        await publish(queue, body)

    transport.publish = recording  # type: ignore[method-assign]


@pytest.fixture
async def running() -> AsyncIterator[Callable[[App], None]]:
    """Run an app's worker (every role) for the rest of the test."""
    workers: list[tuple[App, asyncio.Task[None]]] = []

    def start(app: App) -> None:
        workers.append((app, asyncio.create_task(app.arun(supervisor_interval=0.2))))

    yield start
    for app, worker in workers:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await app._store.close()
        await app._transport.close()


async def finished_attempts(attempts: Attempts, task_id: str, count: int) -> list[ReadableSpan]:
    """The task's `count` attempt spans, once all have ended: the last attempt's span
    ends once its scheduler is through with the reply, just after the task was seen
    terminal."""
    async with asyncio.timeout(HANG_GUARD):
        while len(attempts(task_id)) < count:
            await asyncio.sleep(0.01)
    return attempts(task_id)


def attribute(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {})[f"sasflow.{name}"]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_id(span: ReadableSpan) -> int:
    assert span.parent is not None
    return int(span.parent.span_id)


@pytest.mark.parametrize("transport_name", ["memory", "redis"])
async def test_a_task_is_one_trace_of_attempt_spans_each_with_its_agents_span_under_it(
        tmp_path: Path, transport_name: str, spans: Spans, stock: Stock, http: httpx.Client,
        running: Callable[[App], None]) -> None:
    """Three steps, one retried: four attempt spans in the task's trace (the failed one
    ERROR), each the parent of its agent's span; the httpx call a sync agent made in
    its thread is the child of that agent's span, and the traceparent reached the
    remote service. Over Redis the request crosses the broker: the same links hold."""
    made = shop(tmp_path, TRANSPORTS[transport_name](), stock.url, http)
    record_requests(made)
    running(made.app)
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    await made.app.asubmit("order", {"item": "lamp"}, task_id=task_id)
    task = await made.app.await_(task_id, timeout=HANG_GUARD)
    assert task.state is TaskState.PROCESSED

    attempts = await finished_attempts(spans.attempts, task_id, 4)
    assert [(s.name, attribute(s, "attempt"), attribute(s, "epoch"), attribute(s, "outcome"))
            for s in attempts] == [("reserve", 1, 1, "completed"), ("charge", 1, 1, "gave_up"),
                                   ("charge", 2, 2, "completed"), ("ship", 1, 2, "completed")]
    assert [s.status.status_code for s in attempts] == [
        trace.StatusCode.UNSET, trace.StatusCode.ERROR, trace.StatusCode.UNSET,
        trace.StatusCode.UNSET]
    assert "payment service unreachable" in (attempts[1].status.description or "")
    assert {(attribute(s, "workflow"), attribute(s, "phase"), attribute(s, "task_id"))
            for s in attempts} == {("order", "do", task_id)}
    assert [attribute(s, "agent") for s in attempts] == [
        made.agents[step] for step in ("reserve", "charge", "charge", "ship")]

    # one trace, its id the task's; the attempts hang from the task's own span
    assert {s.context.trace_id for s in spans.all() if s.context} == {int(trace_id_of(task_id), 16)}
    assert len({parent_id(s) for s in attempts}) == 1

    # each agent span is the child of its attempt's span; the failed call says why
    calls = spans.agent_calls(task_id)
    assert [(c.name, parent_id(c)) for c in calls] == [
        (f"agent {made.agents[step]}", span_id(a))
        for step, a in zip(("reserve", "charge", "charge", "ship"), attempts, strict=True)]
    assert calls[1].status.status_code is trace.StatusCode.ERROR
    assert [event.name for event in calls[1].events] == ["exception"]

    # the traceparent travelled in each request: the attempt span's own
    assert [(agent, request.trace) for agent, request in made.sent] == [
        (attribute(a, "agent"), f"00-{trace_id_of(task_id)}-{span_id(a):016x}-01")
        for a in attempts]

    # the httpx call from inside the sync agent's thread: under the agent's span, and
    # the remote service was told so
    [get] = [s for s in spans.all() if TASK_ID not in (s.attributes or {})]
    assert (get.kind, parent_id(get)) == (trace.SpanKind.CLIENT, span_id(calls[0]))
    assert stock.traceparents == [f"00-{trace_id_of(task_id)}-{span_id(get):016x}-01"]


async def test_a_compensation_shows_as_undo_spans_with_the_agents_spans_under_them(
        tmp_path: Path, spans: Spans, running: Callable[[App], None]) -> None:
    """ship refused for good: its attempt is ERROR, then charge and reserve are undone,
    last first, each an `undo` attempt span with its compensator's span under it."""
    made = shop(tmp_path, "memory")
    running(made.app)
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    await made.app.asubmit("order", {"item": "lamp", "address": "nowhere"}, task_id=task_id)
    task = await made.app.await_(task_id, timeout=HANG_GUARD)
    assert task.state is TaskState.COMPENSATED

    attempts = await finished_attempts(spans.attempts, task_id, 6)
    assert [(s.name, attribute(s, "phase"), attribute(s, "outcome")) for s in attempts] == [
        ("reserve", "do", "completed"), ("charge", "do", "gave_up"),
        ("charge", "do", "completed"), ("ship", "do", "failed"),
        ("undo charge", "undo", "completed"), ("undo reserve", "undo", "completed")]
    assert (attempts[3].status.status_code, attempts[3].status.description) == (
        trace.StatusCode.ERROR, "no such address")
    calls = spans.agent_calls(task_id)
    assert [(c.name, attribute(c, "phase"), parent_id(c)) for c in calls[-2:]] == [
        (f"agent {made.agents['charge']}", "undo", span_id(attempts[4])),
        (f"agent {made.agents['reserve']}", "undo", span_id(attempts[5]))]
    assert {s.context.trace_id for s in spans.all() if s.context} == {int(trace_id_of(task_id), 16)}


async def test_with_no_tracer_provider_no_span_is_made_and_requests_carry_no_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        running: Callable[[App], None]) -> None:
    """Tracing off: nothing asks OpenTelemetry for a tracer, and the requests that went
    to the agents (all four of them) have no trace field."""
    remove_provider(monkeypatch)
    asked: list[str] = []
    get_tracer = trace.ProxyTracerProvider.get_tracer

    def asking(provider: trace.ProxyTracerProvider, name: str, *args: Any,
               **kwargs: Any) -> trace.Tracer:
        asked.append(name)
        return get_tracer(provider, name, *args, **kwargs)

    monkeypatch.setattr(trace.ProxyTracerProvider, "get_tracer", asking)
    made = shop(tmp_path, "memory")
    record_requests(made)
    running(made.app)
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    await made.app.asubmit("order", {"item": "lamp"}, task_id=task_id)
    task = await made.app.await_(task_id, timeout=HANG_GUARD)
    assert task.state is TaskState.PROCESSED
    assert [agent for agent, _ in made.sent] == [
        made.agents[step] for step in ("reserve", "charge", "charge", "ship")]
    assert [request.trace for _, request in made.sent] == [None] * 4
    assert asked == []
