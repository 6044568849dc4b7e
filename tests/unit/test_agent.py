"""The agent runtime over in-process queues: replies, errors, and silence at complete-by."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC
from typing import Any

import msgspec
import pytest

from sasflow.agent import AgentFunction, AgentRequest, AgentRuntime
from sasflow.errors import ConfigurationError, PermanentError, TransportError
from sasflow.messages import Reply, Request, decode_reply, encode
from sasflow.model import Phase, idempotency_key
from sasflow.resilience import RetryPolicy
from sasflow.transport.base import agent_queue
from sasflow.transport.memory import MemoryTransport

REPLIES = "sasflow.reply.scheduler-1"
HANG_GUARD = 60.0  # only a hang fails on it, never a slow machine
WITHIN = 60.0  # a request's default complete-by: no test not about it comes near
MARKER = "marker"  # the task id of the reply no_reply() sends behind the others


class Inbox:
    """The scheduler's side: every reply that reaches the reply queue."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.arrived = asyncio.Event()

    async def handler(self, body: bytes) -> None:
        self.replies.append(decode_reply(body))
        self.arrived.set()

    async def one(self) -> Reply:
        async with asyncio.timeout(HANG_GUARD):
            await self.arrived.wait()
        [reply] = self.replies
        return reply


@pytest.fixture
async def transport() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport()
    yield transport
    await transport.close()


@pytest.fixture
async def inbox(transport: MemoryTransport) -> AsyncIterator[Inbox]:
    inbox = Inbox()
    consumer = asyncio.create_task(transport.consume(REPLIES, inbox.handler, prefetch=8))
    yield inbox
    consumer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await consumer


def request(*, within: float = WITHIN, phase: Phase = Phase.DO, result: Any = None,
            epoch: int = 3) -> Request:
    return Request(task_id="order-42", step="charge", phase=phase, agent="payments",
                   epoch=epoch, input={"order_id": 42}, results={"reserve": {"sku": 7}},
                   idempotency_key=idempotency_key("order-42", "charge", phase),
                   complete_by=time.time() + within, reply_to=REPLIES, result=result)


def agent(handler: Callable[[AgentRequest], Any], *, attempts: int = 5) -> AgentFunction:
    return AgentFunction(name="payments", handler=handler,
                         retry=RetryPolicy(attempts=attempts, initial_wait=0.001, jitter=0.0))


async def handle(transport: MemoryTransport, declared: AgentFunction, sent: Request) -> None:
    """Serve one request the way the runtime does for each message of its queue."""
    await AgentRuntime(transport, [declared]).handle(declared, sent)


async def no_reply(inbox: Inbox, transport: MemoryTransport) -> bool:
    """True if no reply was sent before now: a marker reply sent now has arrived,
    and nothing came before it (the reply queue is delivered in order)."""
    await transport.publish(REPLIES, encode(Reply(task_id=MARKER, step="-", phase=Phase.DO,
                                                  epoch=0, ok=True)))
    async with asyncio.timeout(HANG_GUARD):
        while not any(r.task_id == MARKER for r in inbox.replies):
            inbox.arrived.clear()
            await inbox.arrived.wait()
    return [r.task_id for r in inbox.replies] == [MARKER]


async def test_success_replies_with_the_result(transport: MemoryTransport,
                                               inbox: Inbox) -> None:
    """A handler's return value goes back as an ok reply for the same unit and epoch."""
    seen: list[AgentRequest] = []

    def charge(req: AgentRequest) -> dict[str, str]:
        seen.append(req)
        return {"charge_id": "c-1"}

    sent = request()
    await handle(transport, agent(charge), sent)
    reply = await inbox.one()
    assert (reply.task_id, reply.step, reply.phase, reply.epoch) == (
        "order-42", "charge", Phase.DO, 3)
    assert (reply.ok, reply.result, reply.error) == (True, {"charge_id": "c-1"}, None)
    [req] = seen  # what the agent function saw (CONTRACT: req.task_id, req.step, ...)
    assert (req.task_id, req.step, req.attempt) == ("order-42", "charge", 1)
    assert req.input == {"order_id": 42}
    assert req.results == {"reserve": {"sku": 7}}
    assert req.idempotency_key == idempotency_key("order-42", "charge")
    assert req.complete_by.tzinfo is UTC
    assert req.complete_by.timestamp() == pytest.approx(sent.complete_by, abs=1e-6)
    assert not req.compensating
    assert 0 < req.remaining() <= WITHIN


async def test_async_handlers_are_awaited(transport: MemoryTransport, inbox: Inbox) -> None:
    """`async def` agents run on the event loop and reply the same way."""
    async def charge(req: AgentRequest) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"attempt": req.attempt}

    await handle(transport, agent(charge), request())
    assert (await inbox.one()).result == {"attempt": 1}


async def test_sync_handlers_run_off_the_event_loop(transport: MemoryTransport,
                                                    inbox: Inbox) -> None:
    """A blocking `def` agent runs in a worker thread, not on the loop's thread."""
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def charge(req: AgentRequest) -> str:
        threads.append(threading.get_ident())
        time.sleep(0.01)
        return "done"

    await handle(transport, agent(charge), request())
    assert (await inbox.one()).result == "done"
    assert threads and threads[0] != loop_thread


async def test_permanent_error_replies_at_once_without_retrying(transport: MemoryTransport,
                                                               inbox: Inbox) -> None:
    """PermanentError (S6): one call, an error reply marked permanent, straight away."""
    calls: list[int] = []

    def charge(req: AgentRequest) -> None:
        calls.append(req.attempt)
        raise PermanentError("card declined")

    await handle(transport, agent(charge, attempts=10), request())
    reply = await inbox.one()
    assert (reply.ok, reply.permanent, reply.error) == (False, True, "card declined")
    assert calls == [1]


async def test_every_attempt_gets_the_same_idempotency_key(transport: MemoryTransport,
                                                           inbox: Inbox) -> None:
    """Retries pass the step's one key each time, so the remote can deduplicate (S3)."""
    keys: list[tuple[int, str]] = []

    def charge(req: AgentRequest) -> str:
        keys.append((req.attempt, req.idempotency_key))
        if req.attempt < 3:
            raise ConnectionError("connection reset")
        return "charged"

    await handle(transport, agent(charge), request())
    assert (await inbox.one()).result == "charged"
    key = idempotency_key("order-42", "charge")
    assert keys == [(1, key), (2, key), (3, key)]


@pytest.mark.parametrize(("error", "replied"), [
    (ConnectionError("connection refused"), "ConnectionError: connection refused"),
    # the remote's own timeout (a socket's read timing out) has failed like any other,
    # long before the unit's complete-by: replied, not taken for the complete-by
    # passing, which would leave the step silent until then (S5)
    (TimeoutError("read timed out"), "TimeoutError: read timed out"),
], ids=["refused", "remote-timeout"])
async def test_exhausted_retries_reply_gave_up_not_permanent(
        transport: MemoryTransport, inbox: Inbox, error: Exception, replied: str) -> None:
    """Transient failures until the attempts run out: an error reply, not permanent."""
    def charge(req: AgentRequest) -> None:
        raise error

    await handle(transport, agent(charge, attempts=3), request())
    reply = await inbox.one()
    assert (reply.ok, reply.permanent) == (False, False)
    assert reply.error == replied


async def test_async_handler_still_running_at_complete_by_sends_nothing(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """S5: at complete-by the agent stops its work and replies NOTHING, not even an error."""
    cancelled = asyncio.Event()

    async def charge(req: AgentRequest) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    sent = request(within=0.2)
    await handle(transport, agent(charge), sent)
    assert time.time() >= sent.complete_by - 0.1  # it ran until about its complete-by
    assert cancelled.is_set()  # ... and was stopped there, not left to its 30 s
    assert await no_reply(inbox, transport)


async def test_sync_handler_still_running_at_complete_by_sends_nothing(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """A thread cannot be stopped, but its late result is dropped: still no reply (S5)."""
    release = threading.Event()
    finished = threading.Event()

    def charge(req: AgentRequest) -> str:
        release.wait(10)
        finished.set()
        return "too late"

    try:
        await handle(transport, agent(charge), request(within=0.2))
    finally:
        release.set()
    assert await asyncio.to_thread(finished.wait, HANG_GUARD)
    assert await no_reply(inbox, transport)


async def test_transient_failures_until_complete_by_send_nothing(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """Retrying until the complete-by passes ends in silence, not in a gave-up reply."""
    calls: list[int] = []

    async def charge(req: AgentRequest) -> None:
        calls.append(req.attempt)
        await asyncio.sleep(0.05)
        raise ConnectionError("timeout")

    await handle(transport, agent(charge, attempts=1000),
                                             request(within=0.2))
    assert len(calls) >= 2
    assert await no_reply(inbox, transport)


async def test_request_already_past_complete_by_is_not_run(transport: MemoryTransport,
                                                           inbox: Inbox) -> None:
    """A request that arrives after its complete-by: no call and no reply."""
    calls: list[AgentRequest] = []
    await handle(transport, agent(calls.append), request(within=-1.0))
    assert calls == []
    assert await no_reply(inbox, transport)


async def test_a_request_declined_as_too_late_is_logged_once_with_how_late(
        transport: MemoryTransport, caplog: pytest.LogCaptureFixture) -> None:
    """S5 silence, but not a silent drop: one log line that says why and by how much."""
    declared = agent(lambda req: None)
    with caplog.at_level("INFO", logger="sasflow.agent"):
        await AgentRuntime(transport, [declared]).handle(declared, request(within=-2.0))
    [line] = [r.getMessage() for r in caplog.records]
    assert "order-42/charge" in line and "not started" in line
    assert "complete-by passed 2.0" in line and "store's clock" in line


async def test_deadlines_are_judged_on_the_runtimes_clock_not_this_hosts(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """R1: with the store's clock 300 s behind this host's, a request due in 5 s by the
    store's clock runs, and the agent sees 5 s left, in remaining() and complete_by."""
    store_clock = lambda: time.time() - 300.0  # noqa: E731
    sent = request(within=5.0 - 300.0)  # complete-by = store now + 5 s
    seen: list[tuple[float, float]] = []

    def charge(req: AgentRequest) -> dict[str, int]:
        left = req.complete_by.timestamp() - time.time()  # as a host-clock user computes it
        seen.append((req.remaining(), left))
        return {"charge_id": 1}

    declared = agent(charge)
    await AgentRuntime(transport, [declared], clock=store_clock).handle(declared, sent)
    assert (await inbox.one()).ok
    [(remaining, left)] = seen
    assert 4.0 < remaining <= 5.0 and 4.0 < left <= 5.0


async def test_non_json_result_is_a_clear_permanent_error(transport: MemoryTransport,
                                                          inbox: Inbox) -> None:
    """A result that cannot be sent as JSON becomes a permanent error reply saying so."""
    await handle(transport, agent(lambda req: {"at": object()}), request())
    reply = await inbox.one()
    assert (reply.ok, reply.permanent) == (False, True)
    assert reply.error is not None
    assert "result is not JSON-serialisable" in reply.error


async def test_a_non_finite_number_in_the_result_is_a_permanent_error(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """NaN has no JSON form: refused like any unsendable result, never sent on as null."""
    await handle(transport, agent(lambda req: {"amount": float("nan")}), request())
    reply = await inbox.one()
    assert (reply.ok, reply.permanent, reply.result) == (False, True, None)
    assert reply.error is not None
    assert "result is not JSON-serialisable" in reply.error


async def test_compensation_calls_the_compensator_with_the_step_result(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """An undo request runs the compensator, which sees the step's result and its own key."""
    seen: list[AgentRequest] = []
    declared = agent(lambda req: {"charge_id": "c-1"})

    @declared.compensator
    def refund(req: AgentRequest) -> str:
        seen.append(req)
        return "refunded"

    await handle(transport, declared, request(phase=Phase.UNDO, result={"charge_id": "c-1"}))
    reply = await inbox.one()
    assert (reply.ok, reply.phase, reply.result) == (True, Phase.UNDO, "refunded")
    [req] = seen
    assert req.compensating
    assert req.result == {"charge_id": "c-1"}
    assert req.idempotency_key == idempotency_key("order-42", "charge", Phase.UNDO)


async def test_undo_request_for_an_agent_without_compensator_is_acknowledged(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """No compensator means nothing to undo: an ok reply, and the step is not re-run."""
    calls: list[AgentRequest] = []
    await handle(transport, agent(calls.append), request(phase=Phase.UNDO))
    assert (await inbox.one()).ok
    assert calls == []


def test_a_second_compensator_is_refused() -> None:
    """An agent has one undo."""
    declared = agent(lambda req: None)
    declared.compensator(lambda req: None)
    with pytest.raises(ConfigurationError, match="already has a compensator"):
        declared.compensator(lambda req: None)


async def test_run_serves_the_agent_queue(transport: MemoryTransport, inbox: Inbox) -> None:
    """AgentRuntime.run consumes each agent's request queue and replies to reply_to."""
    runtime = AgentRuntime(transport, [agent(lambda req: req.input["order_id"] * 2)])
    serving = asyncio.create_task(runtime.run())
    try:
        await transport.publish(agent_queue("payments"), encode(request()))
        assert (await inbox.one()).result == 84
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def test_a_result_over_the_message_limit_is_a_permanent_error_naming_both_sizes(
        inbox: Inbox) -> None:
    """The size is checked where the reply is made: one call, then an error reply that
    names the reply's size and the transport's limit (R3)."""
    small = MemoryTransport(max_message_bytes=4096)
    replies = asyncio.create_task(small.consume(REPLIES, inbox.handler, prefetch=8))
    calls: list[int] = []

    def charge(req: AgentRequest) -> str:
        calls.append(req.attempt)
        return "z" * 5000

    try:
        await handle(small, agent(charge), request())
        reply = await inbox.one()
    finally:
        replies.cancel()
        await asyncio.gather(replies, return_exceptions=True)
    assert (reply.ok, reply.permanent, reply.result) == (False, True, None)
    assert reply.error is not None
    assert re.fullmatch(r"result of 5\d\d\d bytes is over the message limit of 4096 bytes",
                        reply.error)
    assert calls == [1]


async def test_a_huge_error_text_is_cut_so_the_error_reply_still_goes(
        transport: MemoryTransport, inbox: Inbox) -> None:
    """A PermanentError carrying megabytes (an HTTP error body) still gets its reply
    through, with the text cut and the cut said."""
    def charge(req: AgentRequest) -> None:
        raise PermanentError("e" * (3 * 1024 * 1024))

    await handle(transport, agent(charge), request())
    reply = await inbox.one()
    assert (reply.ok, reply.permanent) == (False, True)
    assert reply.error is not None
    assert reply.error.endswith(f"... ({3 * 1024 * 1024 - 2000} more characters)")
    assert len(reply.error) < 2100


class RefusedReplies(MemoryTransport):
    """In-process queues whose reply queue the broker refuses, as a full or
    unreachable broker would: every publish to it fails."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def publish(self, queue: str, body: bytes) -> None:
        if queue == REPLIES:
            self.refused += 1
            raise TransportError(f"cannot publish to {queue}: broker unreachable")
        await super().publish(queue, body)


async def test_a_reply_that_cannot_be_sent_does_not_run_the_request_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """A publish failure is retried until the complete-by, logged once, and the request
    is settled: the agent function ran once for its one delivery (R3)."""
    transport = RefusedReplies()
    calls: dict[str, int] = {}
    served = asyncio.Event()

    def charge(req: AgentRequest) -> str:
        calls[req.task_id] = calls.get(req.task_id, 0) + 1
        if req.task_id == "sentinel":
            served.set()
        return "charged"

    declared = AgentFunction(name="payments", handler=charge, concurrency=1)
    runtime = AgentRuntime(transport, [declared])
    serving = asyncio.create_task(runtime.run())
    try:
        with caplog.at_level(logging.ERROR, logger="sasflow.agent"):
            await transport.publish(agent_queue("payments"), encode(request(within=2.0)))
            async with asyncio.timeout(HANG_GUARD):
                while not any("reply not sent" in r.message for r in caplog.records):
                    await asyncio.sleep(0.01)
            # one at a time, in order: had the first request been put back, it
            # would be served again before this one
            sentinel = msgspec.structs.replace(request(), task_id="sentinel")
            await transport.publish(agent_queue("payments"), encode(sentinel))
            async with asyncio.timeout(HANG_GUARD):
                await served.wait()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert calls == {"order-42": 1, "sentinel": 1}
    assert transport.refused >= 2  # retried, not given up at the first refusal
    [logged] = [r for r in caplog.records if "order-42" in r.message]
    assert "reply not sent, the step will be recovered after its complete-by" in logged.message
