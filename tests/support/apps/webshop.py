"""A shop for the HTTP API's tests, made afresh for each test's store.

``order`` (reserve -> charge -> ship) stops in error while the task's input names
a ``decline_until`` file that does not exist (a PermanentError from the payment),
so a test can fix the cause and retry through the API; ``restock`` has one step.
"""

from __future__ import annotations

import os
from typing import Any

from sasflow import AgentRequest, App, PermanentError, Step

# no test here is about a deadline: a complete-by a loaded machine cannot miss
TIMEOUT = 600.0


def make_shop(store: str, *, max_payload_bytes: int = 4096) -> App:
    app = App(store=store, max_payload_bytes=max_payload_bytes)

    @app.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        return {"reservation": f"r-{req.task_id}"}

    @reserve.compensator
    def release(req: AgentRequest) -> dict[str, Any]:
        return {"released": req.result["reservation"]}

    @app.agent("payments")
    def charge(req: AgentRequest) -> dict[str, Any]:
        until = (req.input or {}).get("decline_until") if isinstance(req.input, dict) else None
        if until and not os.path.exists(until):
            raise PermanentError("card declined")
        return {"charge_id": f"c-{req.task_id}"}

    @app.agent("shipping")
    def ship(req: AgentRequest) -> dict[str, Any]:
        return {"tracking": f"t-{req.task_id}"}

    app.workflow("order", steps=[Step("reserve", agent="inventory", timeout=TIMEOUT),
                                 Step("charge", agent="payments", timeout=TIMEOUT),
                                 Step("ship", agent="shipping", timeout=TIMEOUT)],
                 on_failure="error")
    app.workflow("restock", steps=[Step("reserve", agent="inventory", timeout=TIMEOUT)])
    return app
