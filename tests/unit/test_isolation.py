"""Sync agents in worker processes: killed at the complete-by, so a hung call applies
nothing after it (SPEC S5); and what a thread cannot promise, shown.

The agent functions are at the top level of this module: a worker process
imports it and finds them by name.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sasflow import App, Step
from sasflow.agent import AgentFunction, AgentRequest, AgentRuntime
from sasflow.errors import ConfigurationError, PermanentError
from sasflow.isolation import FunctionRef, ProcessPool
from sasflow.messages import Request, decode_reply
from sasflow.model import Phase, TaskState, idempotency_key
from sasflow.resilience import RetryPolicy
from sasflow.transport import DeadLetter

# ------------------------------------------------------------ agents run in worker processes


def note(path: Path, text: str) -> None:
    """Write `path` whole at once: a reader never sees it half written."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


SHIP_TIMEOUT = 10.0


def ship(req: AgentRequest) -> dict[str, Any]:
    """Ships once per call: hangs on the first call ever (its pid noted), else ships."""
    folder = Path(req.input["folder"])
    hung = folder / "hung.pid"
    if not hung.exists():
        note(hung, str(os.getpid()))
        time.sleep(3600)
    with (folder / "shipped").open("a") as effect:
        effect.write(f"{req.task_id} by {os.getpid()}\n")
    return {"shipped": req.task_id}


def ship_after_a_child(req: AgentRequest) -> None:
    """Starts a process of its own that would ship later, notes both pids, and hangs."""
    folder = Path(req.input["folder"])
    later = subprocess.Popen(["sh", "-c", f"sleep 3600; echo late >> {folder / 'shipped'}"])
    note(folder / "pids", f"{os.getpid()} {later.pid}")
    time.sleep(3600)


def whoami(req: AgentRequest) -> int:
    return os.getpid()


def unship(req: AgentRequest) -> dict[str, Any]:
    return {"recalled": req.result, "by": os.getpid()}


def refuse(req: AgentRequest) -> None:
    raise PermanentError("address unknown")


class Unpicklable(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")  # pickling calls Unpicklable(message): fails


def raise_unpicklable(req: AgentRequest) -> None:
    raise Unpicklable(503, "busy")


def return_unpicklable(req: AgentRequest) -> Any:
    return threading.Lock()


def die_once(req: AgentRequest) -> int:
    """Dies without a word on its first attempt (a segfault, the OOM killer)."""
    if req.attempt == 1:
        os._exit(7)
    return req.attempt


# ------------------------------------------------------------ helpers


def request(folder: Path, *, within: float = 60.0, task_id: str = "order-7") -> Request:
    return Request(task_id=task_id, step="ship", phase=Phase.DO, agent="shipping", epoch=1,
                   input={"folder": str(folder)}, results={},
                   idempotency_key=idempotency_key(task_id, "ship"),
                   complete_by=time.time() + within, reply_to="sasflow.reply.test")


def gone(pid: int) -> bool:
    """Whether process `pid` no longer runs (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def content(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def appears(path: Path) -> str:
    """The content of `path` once it was written (the hang guard is generous)."""
    async with asyncio.timeout(60):
        while not (written := content(path)):
            await asyncio.sleep(0.01)
    return written


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    pool = ProcessPool("shipping", 2)
    yield pool
    await pool.close()


def ref(fn: Any) -> FunctionRef:
    return FunctionRef.of(fn, agent="shipping")


# ------------------------------------------------------------ the kill


async def test_a_call_cancelled_at_its_deadline_is_killed_before_it_can_ship(
        pool: ProcessPool, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Cancelling a call (as the complete-by does) kills its process and reaps it before
    returning: once it is confirmed dead, its effect can never happen."""
    call = asyncio.create_task(pool.call(ref(ship), request(tmp_path), 1))
    pid = int(await appears(tmp_path / "hung.pid"))  # the call is under way
    with caplog.at_level(logging.INFO, logger="sasflow.agent"):
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert gone(pid)
    assert f"killed worker process {pid} at the complete-by" in caplog.text
    assert not (tmp_path / "shipped").exists()


async def test_what_a_killed_call_started_is_killed_with_it(pool: ProcessPool,
                                                            tmp_path: Path) -> None:
    """The worker process leads its own process group: a process the call started
    dies with it, so it cannot apply the effect late either."""
    call = asyncio.create_task(pool.call(ref(ship_after_a_child), request(tmp_path), 1))
    worker, started = map(int, (await appears(tmp_path / "pids")).split())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert gone(worker)
    async with asyncio.timeout(60):  # the group's SIGKILL reaches it at once; init reaps it
        while not gone(started):
            await asyncio.sleep(0.01)
    assert not (tmp_path / "shipped").exists()


async def test_the_agent_falls_silent_and_kills_a_call_hung_past_its_complete_by(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Through the agent runtime: the call runs past the complete-by, the runtime sends
    nothing (S5), and the process that would have shipped is dead."""
    declared = AgentFunction(name="shipping", handler=ship, isolation="process",
                             concurrency=1, retry=RetryPolicy(attempts=1))
    replies = _Recording()
    runtime = AgentRuntime(replies, [declared])
    serving = asyncio.create_task(runtime.run())  # owns the pools: closes them at the end
    try:
        # a first call with time to spare starts the worker process, so the call
        # that hangs starts at once in it and its deadline can be short
        (tmp_path / "hung.pid").write_text("0")
        await runtime.handle(declared, request(tmp_path, task_id="warm-up"))
        (tmp_path / "hung.pid").unlink()
        [warmed] = (tmp_path / "shipped").read_text().splitlines()
        pid = int(warmed.removeprefix("warm-up by "))
        with caplog.at_level(logging.INFO, logger="sasflow.agent"):
            await runtime.handle(declared, request(tmp_path, within=2.0))
        assert gone(pid)
        assert f"order-7/ship: killed worker process {pid} at the complete-by" in caplog.text
        assert "complete-by passed, falling silent" in caplog.text
        assert (tmp_path / "shipped").read_text() == f"{warmed}\n"  # the hung call never shipped
        assert len(replies.published) == 1  # the warm-up's reply, none for the hung call
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


class _Recording:
    """A transport for handle() alone: replies are kept, and no queue is consumed."""

    shared = False
    max_message_bytes = 1024 * 1024

    def __init__(self) -> None:
        self.published: list[bytes] = []

    async def publish(self, queue: str, body: bytes) -> None:
        self.published.append(body)

    async def consume(self, queue: str, handler: Any, *, prefetch: int) -> None:
        await asyncio.Future()

    async def ping(self) -> None: ...

    def check_queue(self, queue: str) -> None: ...

    async def keep_dead_letter(self, letter: DeadLetter) -> None: ...

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return []

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        return None

    async def purge_dead_letters(self) -> int:
        return 0

    async def close(self) -> None: ...


async def test_a_compensator_of_a_process_agent_runs_in_a_worker_process_too(
        tmp_path: Path) -> None:
    """The agent's isolation holds for its undo as well: it sees the step's result."""
    declared = AgentFunction(name="shipping", handler=ship, isolation="process")
    declared.compensator(unship)
    replies = _Recording()
    runtime = AgentRuntime(replies, [declared])
    serving = asyncio.create_task(runtime.run())
    try:
        undo = msgspec.structs.replace(request(tmp_path), phase=Phase.UNDO,
                                       result={"shipped": "order-7"})
        await runtime.handle(declared, undo)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    [reply] = [decode_reply(body) for body in replies.published]
    assert (reply.ok, reply.phase) == (True, Phase.UNDO)
    assert reply.result["recalled"] == {"shipped": "order-7"}
    assert reply.result["by"] != os.getpid()


# ------------------------------------------------------------ end to end, process vs thread


async def test_a_hung_ship_in_a_process_is_killed_and_the_retry_ships_once(
        tmp_path: Path) -> None:
    """End to end: the first ship hangs past its complete-by and is killed; the step is
    released and run again, and the parcel ships exactly once, after the killed
    process was gone."""
    app = App(store=f"sqlite:///{tmp_path / 'ship.db'}")
    app.agent("shipping", isolation="process", attempts=1)(ship)
    # the first call hangs for ever, so the test lasts one complete-by at least; the
    # retry gets as long to start its process and ship, which a loaded machine needs
    app.workflow("deliver", steps=[Step("ship", agent="shipping", timeout=SHIP_TIMEOUT)],
                 max_failures=5, retry_backoff=0.0)
    worker = asyncio.create_task(app.arun(supervisor_interval=0.1))
    try:
        await app.asubmit("deliver", {"folder": str(tmp_path)}, task_id="parcel-1")
        task = await app.await_("parcel-1", timeout=120)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await app._store.close()
    assert task.state is TaskState.PROCESSED
    assert task.steps[0].attempts >= 2
    hung = int((tmp_path / "hung.pid").read_text())
    assert gone(hung)
    [shipped] = (tmp_path / "shipped").read_text().splitlines()
    assert shipped.startswith("parcel-1 by ") and shipped != f"parcel-1 by {hung}"


async def test_a_hung_ship_in_a_thread_still_ships_after_its_deadline(tmp_path: Path) -> None:
    """What isolation="thread" cannot promise: the hung call is not stopped; once it
    wakes, after the task was already done by the retry, it ships a second time.
    Only the remote's deduplication by idempotency key can then save the effect."""
    wake = threading.Event()
    keys: list[str] = []

    app = App(store=f"sqlite:///{tmp_path / 'ship.db'}")

    @app.agent("shipping", attempts=1)
    def ship_in_thread(req: AgentRequest) -> None:
        keys.append(req.idempotency_key)
        first = not (tmp_path / "hung").exists()
        if first:
            (tmp_path / "hung").write_text("")
            wake.wait(120)
        with (tmp_path / "shipped").open("a") as effect:
            effect.write(f"{'late' if first else 'retry'}\n")

    app.workflow("deliver", steps=[Step("ship", agent="shipping", timeout=SHIP_TIMEOUT)],
                 max_failures=5, retry_backoff=0.0)
    worker = asyncio.create_task(app.arun(supervisor_interval=0.1))
    try:
        await app.asubmit("deliver", {}, task_id="parcel-2")
        task = await app.await_("parcel-2", timeout=120)
        assert task.state is TaskState.PROCESSED
        assert (tmp_path / "shipped").read_text() == "retry\n"
        wake.set()  # the hung call goes on, long past its complete-by
        async with asyncio.timeout(60):
            while (tmp_path / "shipped").read_text() != "retry\nlate\n":
                await asyncio.sleep(0.01)
    finally:
        wake.set()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await app._store.close()
    assert len(set(keys)) == 1  # both calls carried the one key the remote can dedup by


# ------------------------------------------------------------ outcomes and reuse


async def test_worker_processes_are_reused_by_calls_that_return(pool: ProcessPool,
                                                               tmp_path: Path) -> None:
    """A call that returns in time leaves its process for the next one."""
    first = await pool.call(ref(whoami), request(tmp_path), 1)
    second = await pool.call(ref(whoami), request(tmp_path), 1)
    assert first == second != os.getpid()


async def test_a_permanent_error_crosses_the_process_boundary_as_itself(
        pool: ProcessPool, tmp_path: Path) -> None:
    """PermanentError raised in the worker process is raised in the agent: no retry (S6)."""
    with pytest.raises(PermanentError, match="address unknown"):
        await pool.call(ref(refuse), request(tmp_path), 1)


async def test_an_exception_that_cannot_be_pickled_arrives_as_its_name_and_text(
        pool: ProcessPool, tmp_path: Path) -> None:
    """An exception that cannot travel back comes as a RuntimeError naming it (transient)."""
    with pytest.raises(RuntimeError, match=r"^Unpicklable: 503: busy$"):
        await pool.call(ref(raise_unpicklable), request(tmp_path), 1)
    assert await pool.call(ref(whoami), request(tmp_path), 1) > 0  # the process serves on


async def test_a_result_that_cannot_travel_back_is_a_permanent_error(
        pool: ProcessPool, tmp_path: Path) -> None:
    """A result that does not pickle has no JSON form either: refused for good, clearly."""
    with pytest.raises(PermanentError, match="result cannot be sent back from the worker"):
        await pool.call(ref(return_unpicklable), request(tmp_path), 1)


async def test_a_worker_process_that_dies_mid_call_is_a_transient_failure_then_replaced(
        pool: ProcessPool, tmp_path: Path) -> None:
    """A process that dies under a call is a transient failure (retried) and is replaced."""
    with pytest.raises(RuntimeError, match=r"worker process of agent 'shipping' died"
                                           r" \(exit code 7\)"):
        await pool.call(ref(die_once), request(tmp_path), 1)
    assert await pool.call(ref(die_once), request(tmp_path), 2) == 2


async def test_a_function_the_worker_process_cannot_load_is_a_permanent_error(
        pool: ProcessPool, tmp_path: Path) -> None:
    """The first use names the function and why it cannot be loaded."""
    missing = FunctionRef("sasflow_no_such_module", "ship", None)
    with pytest.raises(PermanentError, match=r"cannot load sasflow_no_such_module\.ship in a"
                                             r" worker process: ModuleNotFoundError"):
        await pool.call(missing, request(tmp_path), 1)


# ------------------------------------------------------------ declaration


def test_process_isolation_refuses_functions_a_worker_process_cannot_find() -> None:
    """Lambdas, nested and async functions are refused when the agent is declared."""
    app = App(store="sqlite:///:memory:")

    def nested(req: AgentRequest) -> None: ...

    async def asynchronous(req: AgentRequest) -> None: ...

    with pytest.raises(ConfigurationError, match="top level of a module"):
        app.agent("a", isolation="process")(lambda req: None)
    with pytest.raises(ConfigurationError, match="top level of a module"):
        app.agent("b", isolation="process")(nested)
    with pytest.raises(ConfigurationError, match="is for sync functions"):
        app.agent("c", isolation="process")(asynchronous)
    declared = app.agent("d", isolation="process")(ship)
    with pytest.raises(ConfigurationError, match="top level of a module"):
        declared.compensator(nested)
    assert list(app.agents) == ["d"]


def test_an_unknown_isolation_is_refused() -> None:
    app = App(store="sqlite:///:memory:")
    with pytest.raises(ConfigurationError, match="isolation must be one of thread, process,"
                                                 " got 'fiber'"):
        app.agent("a", isolation="fiber")(ship)  # type: ignore[arg-type]


def test_process_isolation_defaults_to_a_few_processes() -> None:
    """Each concurrent call holds a Python process: 8 by default, not 256 threads."""
    app = App(store="sqlite:///:memory:")
    assert app.agent("a", isolation="process")(ship).concurrency == 8
    assert app.agent("b")(ship).concurrency == 256
    assert app.agent("c", isolation="process", concurrency=2)(ship).concurrency == 2
