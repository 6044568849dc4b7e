"""The application of the liveness scenarios (tests/chaos/test_liveness.py).

Run by real `sasflow worker tests/support/apps/livenessapp.py:app` processes:

* QUICK: one step that answers at once, with a complete-by no machine misses;
* STUCK: one step whose agent never finishes by itself: it stops only when its
  complete-by passes (S5), then the supervisor puts the task in error;
* LONG: one step with a 300 s timeout whose agent sleeps $LIVENESS_SLOW seconds
  (a victim sleeps for ever, a survivor briefly).

Agent names end with $LIVENESS_NS, so that runs sharing a broker never consume
each other's requests.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sasflow import AgentRequest, App, Step

SLOW_ENV = "LIVENESS_SLOW"
NAMESPACE_ENV = "LIVENESS_NS"
QUICK, STUCK, LONG = "quick", "stuck", "long"
STUCK_TIMEOUT = 2.0
LONG_TIMEOUT = 300.0
RETRY_BACKOFF = 0.1


def build_app(store: str | None = None, namespace: str = "") -> App:
    app = App(store=store)
    echo_, stuck_, slow_ = (f"{name}{namespace}" for name in ("echo", "stuck", "slow"))

    @app.agent(echo_, attempts=1)
    async def echo(req: AgentRequest) -> dict[str, Any]:
        return {"pid": os.getpid(), "remaining": req.remaining()}

    @app.agent(stuck_, attempts=1)
    async def stuck(req: AgentRequest) -> None:
        await asyncio.sleep(3600)

    @app.agent(slow_, attempts=1)
    async def slow(req: AgentRequest) -> dict[str, Any]:
        await asyncio.sleep(float(os.environ.get(SLOW_ENV, "0.5")))
        return {"pid": os.getpid()}

    app.workflow(QUICK, [Step("echo", agent=echo_, timeout=60.0)], max_failures=1,
                 on_failure="error")
    app.workflow(STUCK, [Step("stuck", agent=stuck_, timeout=STUCK_TIMEOUT)],
                 max_failures=1, on_failure="error")
    app.workflow(LONG, [Step("slow", agent=slow_, timeout=LONG_TIMEOUT)], max_failures=3,
                 retry_backoff=RETRY_BACKOFF)
    return app


app = build_app(namespace=os.environ.get(NAMESPACE_ENV, ""))
