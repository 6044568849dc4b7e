"""Release 1 of a shipment application: pick, then label (the version-skew scenario).

Release 2 (shipping_r2.py) drops the label step: the step list shrinks while tasks
of release 1 are in flight. Its agents leave effects lines as chaosapp.py's do, and
stall after their effect where the process was told to (CHAOS_HANG_AT).
Run a worker with ``python shipping_r1.py --store URL --instance-id ID``.
"""

from __future__ import annotations

import os
from typing import Any

import chaosapp

from sasflow import AgentRequest, App, Step

WORKFLOW = "shipment"


def declare_agents(app: App) -> None:
    for name in ("picker", "labeller"):
        def run(req: AgentRequest) -> dict[str, Any]:
            chaosapp.record("start", req)
            chaosapp.stall_if_told(req)
            chaosapp.record("end", req)
            return {"pid": os.getpid()}

        app.agent(name, attempts=2, initial_wait=0.01)(run)


def build_app(store: str) -> App:
    app = App(store=store)
    declare_agents(app)
    app.workflow(WORKFLOW, [Step("pick", "picker", chaosapp.STEP_TIMEOUT),
                            Step("label", "labeller", chaosapp.STEP_TIMEOUT)],
                 max_failures=chaosapp.MAX_FAILURES, retry_backoff=chaosapp.RETRY_BACKOFF)
    return app


if __name__ == "__main__":
    chaosapp.main(build=build_app)
