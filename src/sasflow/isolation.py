"""Stoppable sync agents: each call in a worker process, killed at the complete-by (S5).

A sync agent function runs in a thread by default (``isolation="thread"``), and
a thread cannot be stopped: at the complete-by its result is dropped, but the
call goes on and may still apply its effect after the deadline, when another
instance may already be running the step again; only the remote service's
deduplication by idempotency key then keeps the effect single.

With ``@app.agent(name, isolation="process")`` each call runs in a worker
process of the agent's own pool instead. At the complete-by that process, and
any process it started, is killed with SIGKILL and reaped before the agent
moves on, so a hung call applies nothing after its deadline. A worker whose
call returns in time serves the next call; one killed, or dead, is replaced.

What it asks of the agent:

- the function is found by name in the worker process, so it is defined at the
  top level of an importable module: no lambda, nested function or interactive
  session (checked when the agent is declared);
- the request and the result travel pickled (a request always can; a result has
  to be JSON-serialisable anyway), and so do exceptions (one that cannot is
  sent back as its type name and text);
- the application's module is imported again in each worker process, so a
  script keeps its start-up under ``if __name__ == "__main__":``.

Worker processes come from multiprocessing's forkserver (spawn where there is
none): never a fork of the running worker with its threads, connections and
locks. A worker process also dies with the agent's process, however that ends
(a lifeline pipe), so a SIGKILLed worker leaves no hung call behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from types import ModuleType
from typing import Any, Literal

from sasflow.errors import ConfigurationError, PermanentError
from sasflow.messages import Request

__all__ = ["ISOLATIONS", "FunctionRef", "Isolation", "ProcessPool"]

log = logging.getLogger("sasflow.agent")

Isolation = Literal["thread", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("thread", "process")

# What a worker process sends back for one call: (outcome, value).
_RETURNED, _RAISED, _UNLOADABLE, _UNSENDABLE = "returned", "raised", "unloadable", "unsendable"


@dataclass(frozen=True, slots=True)
class FunctionRef:
    """Where a worker process finds an agent function: its module and qualified name.

    The file is kept too, for a module that was loaded from a path (``sasflow
    worker app.py:app``) and so cannot be imported by its name alone.
    """

    module: str
    qualname: str
    path: str | None

    @classmethod
    def of(cls, fn: Callable[..., Any], *, agent: str) -> FunctionRef:
        """The reference to `fn`; ConfigurationError if a worker process could not find it."""
        if inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"agent {agent!r}: isolation='process' is for sync functions; an async"
                " agent is cancelled at its complete-by already", agent=agent)
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
            raise ConfigurationError(
                f"agent {agent!r}: isolation='process' needs a function defined at the top"
                f" level of a module, which the worker process imports by name; got {fn!r}",
                agent=agent)
        path = getattr(sys.modules.get(module), "__file__", None)
        if module == "__main__" and path is None:
            raise ConfigurationError(
                f"agent {agent!r}: isolation='process' cannot reach a function of an"
                " interactive session: define it in a module", agent=agent)
        return cls(module, qualname, path)

    def __str__(self) -> str:
        return f"{self.module}.{self.qualname}"

    def resolve(self) -> Callable[..., Any]:
        """The function itself (in a worker process)."""
        from sasflow.agent import AgentFunction  # the agent module imports this one

        target: Any = _module(self.module, self.path)
        for part in self.qualname.split("."):
            target = getattr(target, part)
        # @app.agent leaves its AgentFunction where the function was defined
        return target.handler if isinstance(target, AgentFunction) else target


def _module(name: str, path: str | None) -> ModuleType:
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except ImportError:
        if path is None:
            raise
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class ProcessPool:
    """The worker processes of one agent: at most `size` at once, each one call at a time.

    One started process is kept waiting (`warm`), so that a call, which has its
    complete-by to keep, seldom pays for a process's start: the interpreter, the
    application's imports (preloaded), some hundreds of milliseconds.
    """

    def __init__(self, agent: str, size: int, *, preload: Sequence[FunctionRef] = ()) -> None:
        self.agent = agent
        self._context = _context()
        self._preload = tuple(preload)
        self._slots = asyncio.Semaphore(max(1, size))
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._warming: asyncio.Future[_Worker] | None = None
        self._closed = False
        # a call's thread sends its request and waits for the answer (killing the
        # process ends the wait); one more thread starts the spare process
        self._threads = ThreadPoolExecutor(max_workers=max(1, size) + 1,
                                           thread_name_prefix=f"sasflow-{agent}")

    def warm(self) -> None:
        """Start a spare process now, unless one waits already."""
        if not self._closed and not self._idle and self._warming is None:
            self._warming = asyncio.get_running_loop().run_in_executor(
                self._threads, _Worker, self._context, self._preload)

    async def call(self, ref: FunctionRef, request: Request, attempt: int) -> Any:
        """Run the function on `request` in a worker process; cancelling kills the process."""
        loop = asyncio.get_running_loop()
        async with self._slots:
            worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.process.is_alive():
                if worker is not None:
                    await self._discard(worker)
                worker = await self._start()
            try:
                outcome, value = await loop.run_in_executor(
                    self._threads, worker.exchange, (ref, request, attempt))
            except asyncio.CancelledError:
                # the complete-by: nothing of this call may happen after it (S5)
                await self._discard(worker)
                log.info("%s %s/%s: killed worker process %s at the complete-by", self.agent,
                         request.task_id, request.step, worker.pid)
                raise
            except (EOFError, OSError):
                await self._discard(worker)
                raise RuntimeError(
                    f"the worker process of agent {self.agent!r} died (exit code"
                    f" {worker.exitcode})" + ("" if worker.answered else _STARTUP_HINT)
                ) from None
            worker.answered += 1
            self._idle.append(worker)
        if outcome == _RETURNED:
            return value
        if outcome == _RAISED:
            raise value
        if outcome == _UNLOADABLE:
            raise PermanentError(f"agent {self.agent!r}: cannot load {ref} in a worker"
                                 f" process: {value}", agent=self.agent)
        raise PermanentError(f"result cannot be sent back from the worker process: {value}",
                             agent=self.agent)

    async def _start(self) -> _Worker:
        """The spare process if one is starting, else a new one."""
        starting, self._warming = self._warming, None
        if starting is None:
            starting = asyncio.get_running_loop().run_in_executor(
                self._threads, _Worker, self._context, self._preload)
        try:
            worker = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_stop_unused)  # started after all: not left running
            raise
        self._all.add(worker)
        return worker

    async def _discard(self, worker: _Worker) -> None:
        """Kill a worker process, wait until it is gone, and have a spare one started."""
        self._all.discard(worker)
        worker.kill()
        # reaping after SIGKILL is immediate; off the loop all the same
        await asyncio.get_running_loop().run_in_executor(None, worker.close)
        self.warm()

    async def close(self) -> None:
        """Kill every worker process, busy, idle or starting (the runtime is stopping)."""
        self._closed = True
        if self._warming is not None:
            self._warming.add_done_callback(_stop_unused)
            self._warming = None
        self._idle.clear()
        workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.close) for w in workers))
        self._threads.shutdown(wait=False, cancel_futures=True)


# A process that dies before its first answer most often could not even start.
_STARTUP_HINT = (" before its first answer; its output says why (a script that declares"
                 " the agent keeps its start-up under `if __name__ == \"__main__\":`)")


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, context: BaseContext, preload: tuple[FunctionRef, ...]) -> None:
        self.connection, child = context.Pipe()
        # never written: it closes when this process ends, however it ends
        lifeline, self._lifeline = context.Pipe(duplex=False)
        # daemon: at exit, multiprocessing stops it rather than waiting for it
        self.process = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(child, lifeline, preload), name="sasflow-agent-process",
            daemon=True)
        self.process.start()
        child.close()
        lifeline.close()
        self.pid: int = self.process.pid
        self.answered = 0  # calls it answered
        self.exitcode: int | None = None  # once closed

    def exchange(self, job: tuple[FunctionRef, Request, int]) -> tuple[str, Any]:
        self.connection.send(job)
        answer: tuple[str, Any] = self.connection.recv()
        return answer

    def kill(self) -> None:
        """SIGKILL the process and its process group (anything the call started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # before it made its own group

    def close(self) -> None:
        self.process.join()
        self.exitcode = self.process.exitcode
        self.connection.close()
        self._lifeline.close()
        self.process.close()


def _stop_unused(starting: asyncio.Future[_Worker]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        worker = starting.result()
        worker.kill()
        worker.close()


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


# ---------------------------------------------------------------- the worker process
def _serve(connection: Connection, lifeline: Connection,
           preload: tuple[FunctionRef, ...]) -> None:
    """A worker process's loop: one call at a time until the agent closes the pipe."""
    with contextlib.suppress(OSError):
        os.setsid()  # its own process group: killing it kills what it started
    threading.Thread(target=_die_with_the_agent, args=(lifeline,), daemon=True,
                     name="sasflow-lifeline").start()
    from sasflow.agent import AgentRequest

    # loaded now, before any call waits for them; a failure is told at the first call
    loaded: dict[FunctionRef, Callable[..., Any] | str] = {}
    for ref in preload:
        loaded[ref] = _load(ref)
    while True:
        try:
            ref, request, attempt = connection.recv()
        except (EOFError, OSError):
            return
        fn = loaded.get(ref) or loaded.setdefault(ref, _load(ref))
        if isinstance(fn, str):
            connection.send((_UNLOADABLE, fn))
            continue
        try:
            answer: tuple[str, Any] = (_RETURNED, fn(AgentRequest(request, attempt)))
        except BaseException as error:  # every outcome goes back to the agent
            answer = (_RAISED, _portable(error))
        try:
            connection.send(answer)
        except Exception as error:  # the result does not pickle: nothing was written
            connection.send((_UNSENDABLE, f"{type(error).__name__}: {error}"))


def _load(ref: FunctionRef) -> Callable[..., Any] | str:
    """The function, or why it cannot be loaded."""
    try:
        return ref.resolve()
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def _portable(error: BaseException) -> Exception:
    """`error` as the agent can receive it: an Exception that survives pickling."""
    if isinstance(error, Exception):
        with contextlib.suppress(Exception):
            pickle.loads(pickle.dumps(error))
            return error
    kind = PermanentError if isinstance(error, PermanentError) else RuntimeError
    return kind(f"{type(error).__name__}: {error}")


def _die_with_the_agent(lifeline: Connection) -> None:
    """Kill this process (and its group) once the agent's process is gone.

    An agent process killed with SIGKILL cannot kill its calls; a hung call left
    running would apply its effect after its deadline. The lifeline's other end
    lives only in the agent's process, so it reads end-of-file when that process
    ends, however it ends. (The forkserver, this process's parent, outlives the
    agent while any of its children runs, so a parent-death signal would not do.)
    """
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    me = os.getpid()
    with contextlib.suppress(OSError):
        if os.getpgid(0) == me:  # the group it leads: itself and what the call started
            os.killpg(me, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)
