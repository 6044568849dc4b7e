"""The application of the distributed chaos scenarios (support/dist.py runs it).

``sasflow worker tests/support/apps/distapp.py:app`` serves the slow and the remote
agents of chaosapp.py (traced to the same effects file, see there), under names
suffixed with a per-test namespace (``DIST_NAMESPACE``): agent queues on a shared
broker are named after agents, so two runs on one RabbitMQ never consume each
other's requests.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
from typing import Any

import chaosapp
from chaosapp import HOLD, MAX_FAILURES, PARENT_ENV, RETRY_BACKOFF, SLOW_ENV, STEP_TIMEOUT

from sasflow import AgentRequest, App, PermanentError, Step

NAMESPACE_ENV = "DIST_NAMESPACE"
ORDER = "order"
ORDER_STEP_TIMEOUT = 3.0  # room for seven processes on two cores; a kill still expires fast
ORDER_MAX_FAILURES = 20  # a slow machine may expire a step a few times: never compensate here
STEP_AGENT = {"reserve": "inventory", "charge": "payments", "ship": "shipping", "hold": "slow"}


def agent_name(base: str, namespace: str) -> str:
    return f"{base}-{namespace}"


def build_app(namespace: str, store: str | None = None) -> App:
    """The agents of chaosapp.py, named within `namespace`, and two workflows:
    HOLD (one slow step) and ORDER (reserve, charge, ship against the RemoteService)."""
    app = App(store=store)

    @app.agent(agent_name("slow", namespace))
    def slow(req: AgentRequest) -> dict[str, Any]:
        chaosapp.record("start", req)
        time.sleep(float(os.environ.get(SLOW_ENV, "0.5")))
        chaosapp.record("end", req)
        return {"pid": os.getpid()}

    def remote_agent(base: str, operation: str) -> None:
        def do(req: AgentRequest) -> dict[str, Any]:
            chaosapp.record("start", req)
            if req.input.get(f"refuse_{req.step}"):
                raise PermanentError(f"{req.step} refused for order {req.input['order_id']}")
            reply = chaosapp.call_remote(operation, req)
            chaosapp.stall_if_told(req)
            chaosapp.record("end", req)
            return {"pid": os.getpid(), "effect_id": reply["effect_id"]}

        app.agent(agent_name(base, namespace), attempts=5, initial_wait=0.02, max_wait=0.2)(do)

    remote_agent("inventory", "reserve")
    remote_agent("payments", "charge")
    remote_agent("shipping", "ship")

    app.workflow(HOLD, [Step("hold", agent_name("slow", namespace), STEP_TIMEOUT)],
                 max_failures=MAX_FAILURES, retry_backoff=RETRY_BACKOFF)
    app.workflow(ORDER, [Step(step, agent_name(STEP_AGENT[step], namespace), ORDER_STEP_TIMEOUT)
                         for step in ("reserve", "charge", "ship")],
                 max_failures=ORDER_MAX_FAILURES, retry_backoff=RETRY_BACKOFF)
    return app


def _in_worker() -> None:
    """In a worker process: die with the test run, dump stacks on SIGUSR1."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or int(parent) == os.getpid():
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        sys.exit(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, chaosapp._dump_tasks)  # what Cluster.diagnostics asks for


_in_worker()
app = build_app(os.environ.get(NAMESPACE_ENV, "local"))
