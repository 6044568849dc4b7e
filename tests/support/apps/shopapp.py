"""A small shop for the command-line tests: reserve -> charge -> ship.

Behaviour the tests steer through the task's input:

- ``{"decline_until": PATH}``: the payment is declined (a PermanentError) until
  the file PATH exists, so a test can "fix the cause" before an operator retry.
- every agent records its calls (and the compensator its undos) in
  ``{"journal": PATH}`` when given, one JSON line per call.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sasflow import AgentRequest, App, PermanentError, Step

# small, so a test can send an input over the limit without a big command line
app = App(max_payload_bytes=2048)


def _record(req: AgentRequest, what: str) -> None:
    journal = (req.input or {}).get("journal")
    if journal:
        with open(journal, "a", encoding="utf-8") as f:
            f.write(json.dumps({"task_id": req.task_id, "step": req.step, "what": what}) + "\n")


@app.agent("inventory")
def reserve(req: AgentRequest) -> dict[str, Any]:
    _record(req, "reserve")
    return {"reservation": f"r-{req.task_id}"}


@reserve.compensator
def release(req: AgentRequest) -> dict[str, Any]:
    _record(req, "release")
    return {"released": req.result["reservation"]}


@app.agent("payments")
def charge(req: AgentRequest) -> dict[str, Any]:
    _record(req, "charge")
    until = (req.input or {}).get("decline_until")
    if until and not os.path.exists(until):
        raise PermanentError("card declined")
    return {"charge_id": f"c-{req.task_id}"}


@app.agent("shipping")
def ship(req: AgentRequest) -> dict[str, Any]:
    _record(req, "ship")
    return {"tracking": f"t-{req.task_id}"}


# No test here is about a step running out of time: give each a complete-by that a
# loaded machine cannot miss, so slowness never turns into expiries and an error.
STEP_TIMEOUT = 600.0
STEPS = [Step("reserve", agent="inventory", timeout=STEP_TIMEOUT),
         Step("charge", agent="payments", timeout=STEP_TIMEOUT),
         Step("ship", agent="shipping", timeout=STEP_TIMEOUT)]

# a declined payment stops the order in error for an operator to act on (E8)
app.workflow("order", steps=STEPS, on_failure="error")

# not an App: for the test of a reference to the wrong kind of object
not_an_app = {"name": "shop"}

# a second workflow, for listing by workflow
app.workflow("restock", steps=[Step("reserve", agent="inventory", timeout=STEP_TIMEOUT)])
