"""The application the chaos scenarios run in real worker processes.

Every agent leaves a trace of what it did in an effects file shared by all the
processes of a scenario: one line per event, written with a single ``os.write``
on an ``O_APPEND`` descriptor, so lines from concurrent processes never tear::

    EVENT TASK STEP PHASE IDEMPOTENCY_KEY PID TIME

``start`` is written when an agent begins a unit of work, ``end`` when it has
done it (just before returning), ``hang`` when this process was told to stall
at that point (after the unit's effect, before its reply) so that a scenario
can kill it there.

How a process behaves comes from its environment, so the same code runs as the
victim and as the survivor:

* ``CHAOS_EFFECTS``: the effects file;
* ``CHAOS_REMOTE_URL``: the RemoteService the order agents call over HTTP;
* ``CHAOS_SLOW``: seconds the ``slow`` agent sleeps (default 0.5);
* ``CHAOS_HANG_AT``: comma-separated ``phase:step`` points (``do:charge``,
  ``undo:charge``) where this process stalls after the remote effect;
* ``CHAOS_PARENT_PID``: the test process; a worker never outlives it.

Run a worker with ``python chaosapp.py --store URL --instance-id ID --roles ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from sasflow import AgentRequest, App, PermanentError, Step

EFFECTS_ENV = "CHAOS_EFFECTS"
REMOTE_ENV = "CHAOS_REMOTE_URL"
SLOW_ENV = "CHAOS_SLOW"
HANG_ENV = "CHAOS_HANG_AT"
PARENT_ENV = "CHAOS_PARENT_PID"

# Short windows keep every scenario well under 30 s; recovery bounds derive from them.
STEP_TIMEOUT = 1.5  # every step's complete-by window
INTERVAL = 0.25  # supervisor interval
LEASE_TTL = max(3 * INTERVAL, 1.0)  # the supervisor lease (Supervisor.lease_ttl)
RETRY_BACKOFF = 0.05  # how long a released task waits before it may be claimed again
MAX_FAILURES = 5

PIPELINE = "pipeline"  # three local steps; the middle one is slow
HOLD = "hold"  # one slow step
ORDER = "order"  # reserve, charge, ship against the RemoteService; undo by release, refund

HANG_FOR = 3600.0  # a stalled agent never wakes up on its own: the scenario kills it


def record(event: str, req: AgentRequest) -> None:
    """Append one effects line atomically (one write on an O_APPEND descriptor)."""
    phase = "undo" if req.compensating else "do"
    line = (f"{event} {req.task_id} {req.step} {phase} {req.idempotency_key} {os.getpid()}"
            f" {time.time():.6f}\n")
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def stall_if_told(req: AgentRequest) -> None:
    """Stop here, the effect applied and no reply sent, if this process was told to."""
    phase = "undo" if req.compensating else "do"
    points = {p.strip() for p in os.environ.get(HANG_ENV, "").split(",") if p.strip()}
    if f"{phase}:{req.step}" in points:
        record("hang", req)
        time.sleep(HANG_FOR)


def call_remote(operation: str, req: AgentRequest) -> Any:
    """POST one operation with the unit's idempotency key; 4xx is permanent, else retry."""
    response = httpx.post(f"{os.environ[REMOTE_ENV]}/{operation}",
                          json={"order_id": req.input["order_id"]},
                          headers={"Idempotency-Key": req.idempotency_key},
                          timeout=max(0.05, req.remaining()))
    if 400 <= response.status_code < 500:
        raise PermanentError(f"{operation}: HTTP {response.status_code} {response.text}")
    response.raise_for_status()
    return response.json()


def build_app(store: str) -> App:
    app = App(store=store)

    @app.agent("quick")
    def quick(req: AgentRequest) -> dict[str, Any]:
        record("start", req)
        record("end", req)
        return {"pid": os.getpid()}

    @app.agent("slow")
    def slow(req: AgentRequest) -> dict[str, Any]:
        # a thread, not a coroutine: it sleeps through a SIGSTOP and cannot be cancelled
        record("start", req)
        time.sleep(float(os.environ.get(SLOW_ENV, "0.5")))
        record("end", req)
        return {"pid": os.getpid()}

    def remote_agent(name: str, operation: str, undo: str | None) -> None:
        def do(req: AgentRequest) -> dict[str, Any]:
            record("start", req)
            if req.input.get(f"refuse_{req.step}"):
                raise PermanentError(f"{req.step} refused for order {req.input['order_id']}")
            reply = call_remote(operation, req)
            stall_if_told(req)
            record("end", req)
            return {"pid": os.getpid(), "effect_id": reply["effect_id"]}

        def undo_it(req: AgentRequest) -> dict[str, Any]:
            record("start", req)
            reply = call_remote(undo, req) if undo else {"effect_id": None}
            stall_if_told(req)
            record("end", req)
            return {"pid": os.getpid(), "effect_id": reply["effect_id"]}

        agent = app.agent(name, attempts=5, initial_wait=0.02, max_wait=0.2)(do)
        agent.compensator(undo_it)

    remote_agent("inventory", "reserve", "release")
    remote_agent("payments", "charge", "refund")
    remote_agent("shipping", "ship", None)  # nothing remote to undo; must never run anyway

    policy: dict[str, Any] = {"max_failures": MAX_FAILURES, "retry_backoff": RETRY_BACKOFF}
    app.workflow(PIPELINE, [Step("a", "quick", STEP_TIMEOUT), Step("b", "slow", STEP_TIMEOUT),
                            Step("c", "quick", STEP_TIMEOUT)], **policy)
    app.workflow(HOLD, [Step("hold", "slow", STEP_TIMEOUT)], **policy)
    app.workflow(ORDER, [Step("reserve", "inventory", STEP_TIMEOUT),
                         Step("charge", "payments", STEP_TIMEOUT),
                         Step("ship", "shipping", STEP_TIMEOUT)],
                 on_failure="compensate", **policy)
    return app


def _die_with_parent() -> None:
    """Never outlive the test run that started this worker, even if it is killed."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = os.environ.get(PARENT_ENV)
    if parent and os.getppid() != int(parent):  # the parent died before prctl took effect
        sys.exit(1)


def _dump_tasks(signum: int, frame: object) -> None:
    """Print each asyncio task's chain of awaits, innermost last."""
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        return
    for task in tasks:
        chain: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and hasattr(awaited, "cr_frame"):
            code = awaited.cr_frame.f_code if awaited.cr_frame else None
            where = f"{code.co_filename}:{awaited.cr_frame.f_lineno}" if code else "?"
            chain.append(f"{getattr(awaited, '__qualname__', awaited)} at {where}")
            awaited = getattr(awaited, "cr_await", None)
        chain.append(repr(awaited)[:300])
        print(f"--- task {task.get_name()}:\n    " + "\n    ".join(chain), file=sys.stderr)


def main(argv: list[str] | None = None, build: Callable[[str], App] | None = None) -> None:
    """Run a worker of `build`'s application (this one's by default) until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--roles", default="scheduler,agent,supervisor")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--interval", type=float, default=INTERVAL)
    args = parser.parse_args(argv)
    _die_with_parent()
    # on a timeout the harness asks for every thread's and every asyncio task's stack
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, _dump_tasks)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.instance_id} %(name)s %(message)s")
    (build or build_app)(args.store).run(roles=args.roles.split(","), concurrency=args.concurrency,
                              supervisor_interval=args.interval,
                              instance_id=args.instance_id)


if __name__ == "__main__":
    main()
