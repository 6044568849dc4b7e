"""The application the scenario tests run in real ``sasflow worker`` processes.

An order is reserved, charged and shipped by three agents, each calling one
operation of the flaky remote service (sasflow.examples.orders.remote) over
HTTP with the unit's idempotency key (sasflow.examples.orders.app.call_remote:
5xx, dropped and late replies are retried, 4xx is permanent). A failed order
is compensated: ``payments`` refunds a charge, ``inventory`` releases a
reservation; ``shipping`` is the last step and has nothing to undo.

The task's input carries what the agents send, so nothing but the store and
the remote service is shared between processes:

* ``{"order_id": n, "card": "ok"}``: processed;
* ``"card": "declined"``: the remote refuses the charge (HTTP 402), so the
  reservation is released;
* ``"refuse_ship": true``: the shipping agent refuses the order before calling
  the remote, so the charge is refunded, then the reservation released;
* with it, ``"refund_fault": "permanent"``: the refund fails for good (the
  compensator raises PermanentError before calling the remote);
  ``"refund_fault": "hang"``: the refund is applied, then the compensator hangs
  past its complete-by, on every attempt.

* ``"linger_s": s``: each operation holds its task ``s`` seconds more after the
  remote applied it (well under a step's complete-by), so that a fault that must
  find a worker holding tasks finds some, however fast the machine runs them.

A worker started with ``SCENARIO_STALL_AT=refund`` (operations, comma-separated) in
its environment hangs after the remote applied each of those operations, whatever
the order, holding its task: a test SIGKILLs it there (mid-compensation, say).

Run a worker with ``python scenarioapp.py worker scenarioapp.py:app --store URL
--transport URL ...``: the arguments are ``sasflow``'s own; this entry point
only makes sure the worker never outlives the test that started it and dumps
its threads' stacks on SIGUSR1 (for a test that timed out).
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import os
import signal
import sys
from typing import Any

from sasflow import AgentRequest, App, PermanentError, Step
from sasflow.cli import main as sasflow_main
from sasflow.examples.orders.app import REMOTE_ENV, call_remote

__all__ = ["MAX_FAILURES", "PARENT_ENV", "REMOTE_ENV", "STALL_ENV", "STEPS", "STEP_TIMEOUT",
           "UNDO", "WORKFLOW",
           "app", "build_app", "order_input", "remote"]

WORKFLOW = "order"
STEPS = ("reserve", "charge", "ship")  # step name = the remote operation it applies
UNDO = {"reserve": "release", "charge": "refund"}  # step -> the operation undoing it

# Short windows keep a recovery within seconds: a step whose agent died, or whose
# request was lost with a broker, expires after STEP_TIMEOUT and is dispatched again.
STEP_TIMEOUT = 3.0
MAX_FAILURES = 6  # expiries of one task (all its units) before it is given up and undone
RETRY_BACKOFF = 0.1
PARENT_ENV = "SCENARIO_PARENT_PID"
STALL_ENV = "SCENARIO_STALL_AT"
HANG_FOR = 3600.0  # a hung compensator never wakes up on its own

_AGENT_OPTIONS: dict[str, Any] = {"attempts": 20, "initial_wait": 0.02, "max_wait": 0.3,
                                  "failure_threshold": 50, "reset_timeout": 0.5}


def order_input(n: int) -> dict[str, Any]:
    """Order n: one in ten has a declined card, one in ten is refused by shipping."""
    return {"order_id": n, "card": "declined" if n % 10 == 3 else "ok",
            "refuse_ship": n % 10 == 7}


async def remote(operation: str, req: AgentRequest, body: dict[str, Any]) -> dict[str, Any]:
    """Apply one operation; the result the store keeps says which effect, under which key.

    The remote's reply carries its own effect id (``charge-17``): a retry answered from
    its idempotency store gets the same id, so the scenario can match every effect the
    remote applied with the one unit of work in the store that caused it.
    """
    reply = await call_remote(operation, req, body)
    if req.input.get("linger_s"):
        await asyncio.sleep(req.input["linger_s"])
    if operation in os.environ.get(STALL_ENV, "").split(","):
        await asyncio.sleep(HANG_FOR)
    return {"effect_id": reply["effect_id"], "operation": operation,
            "key": req.idempotency_key, "pid": os.getpid()}


def build_app() -> App:
    app = App()  # the store and transport come from the command line

    @app.agent("inventory", **_AGENT_OPTIONS)
    async def reserve(req: AgentRequest) -> Any:
        return await remote("reserve", req, {"order_id": req.input["order_id"]})

    @reserve.compensator
    async def release(req: AgentRequest) -> Any:
        return await remote("release", req, {"order_id": req.input["order_id"]})

    @app.agent("payments", **_AGENT_OPTIONS)
    async def charge(req: AgentRequest) -> Any:
        return await remote("charge", req, {"order_id": req.input["order_id"],
                                            "amount": 10 + req.input["order_id"] % 90,
                                            "card": req.input["card"]})

    @charge.compensator
    async def refund(req: AgentRequest) -> Any:
        fault = req.input.get("refund_fault")
        if fault == "permanent":
            raise PermanentError(f"refund of order {req.input['order_id']} refused")
        done = await remote("refund", req, {"order_id": req.input["order_id"]})
        if fault == "hang":
            await asyncio.sleep(HANG_FOR)
        return done

    @app.agent("shipping", **_AGENT_OPTIONS)
    async def ship(req: AgentRequest) -> Any:
        if req.input.get("refuse_ship"):
            raise PermanentError(f"shipping refuses order {req.input['order_id']}")
        return await remote("ship", req, {"order_id": req.input["order_id"]})

    app.workflow(WORKFLOW, [Step("reserve", "inventory", STEP_TIMEOUT),
                            Step("charge", "payments", STEP_TIMEOUT),
                            Step("ship", "shipping", STEP_TIMEOUT)],
                 max_failures=MAX_FAILURES, on_failure="compensate",
                 retry_backoff=RETRY_BACKOFF)
    return app


app = build_app()


def _die_with_parent() -> None:
    """Never outlive the test process, even if it is SIGKILLed."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = os.environ.get(PARENT_ENV)
    if parent and os.getppid() != int(parent):  # it died before prctl took effect
        sys.exit(1)


if __name__ == "__main__":
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sasflow_main(sys.argv[1:])
