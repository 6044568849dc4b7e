"""The order-processing example: reserve stock, charge the card, ship (SPEC E1-E11).

Three agents, each the only code that talks to one operation of the (flaky)
remote service over HTTP:

* ``inventory`` reserves the order's stock; its compensator releases it;
* ``payments`` charges the card; its compensator refunds it;
* ``shipping`` ships the order.

Every call carries the step's stable idempotency key, so a retry after a lost
or late reply is answered from the service's idempotency store instead of
applying the effect again (S3). A 4xx (a declined card) is a nontransient fault
(PermanentError, S6); a 5xx, a dropped connection or a timeout is transient and
retried by the runtime within the step's complete-by.

Run workers for it with ``sasflow worker sasflow.examples.orders.app:app``; the
state store comes from ``$SASFLOW_STORE`` and the remote service's address from
``$SASFLOW_DEMO_REMOTE``.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

import httpx

from sasflow import AgentRequest, App, PermanentError, Step
from sasflow.examples.orders.orders import ORDERS_SCHEMA, WORKFLOW, read_order

__all__ = [
    "DEFAULT_REMOTE",
    "ORDERS_SCHEMA",
    "REMOTE_ENV",
    "RemoteUnavailable",
    "app",
    "build_app",
    "call_remote",
    "read_order",
]

REMOTE_ENV = "SASFLOW_DEMO_REMOTE"
DEFAULT_REMOTE = "http://127.0.0.1:8765"  # where `python -m sasflow.examples.orders.remote` listens

# The remote service is known to be flaky: the breaker should only trip on a real
# outage (a long run of failures), and probe again soon, or the demo would spend
# most of its time failing fast.
_AGENT_OPTIONS: dict[str, Any] = {"attempts": 10, "initial_wait": 0.05, "max_wait": 0.5,
                                  "failure_threshold": 10, "reset_timeout": 1.0}


class RemoteUnavailable(Exception):
    """The remote service did not answer usefully (5xx, connection lost, timeout): retry."""


def remote_url() -> str:
    return os.environ.get(REMOTE_ENV, DEFAULT_REMOTE).rstrip("/")


# One connection pool per process. An httpx.AsyncClient belongs to the event loop
# it was first used in, so the pool is kept per loop (a process normally has one).
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary())


def _client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=64)
        client = _clients[loop] = httpx.AsyncClient(base_url=remote_url(), limits=limits)
    return client


async def call_remote(operation: str, req: AgentRequest, body: dict[str, Any]) -> Any:
    """POST one operation with the step's idempotency key, before its complete-by."""
    try:
        response = await _client().post(
            f"/{operation}", json=body, timeout=req.remaining(),
            headers={"Idempotency-Key": req.idempotency_key})
    except httpx.TransportError as error:  # refused, dropped, timed out: may be applied
        raise RemoteUnavailable(f"{operation} order {body['order_id']}: "
                                f"{type(error).__name__}: {error}") from error
    if response.status_code >= 500:
        raise RemoteUnavailable(f"{operation} order {body['order_id']}: "
                                f"HTTP {response.status_code}")
    if response.status_code >= 400:
        raise PermanentError(f"{operation} order {body['order_id']} refused: HTTP "
                             f"{response.status_code} {_reason(response)}")
    try:
        return response.json()
    except ValueError as error:  # a garbled reply tells us nothing: ask again
        raise RemoteUnavailable(f"{operation} order {body['order_id']}: bad reply") from error


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", ""))
    except (ValueError, AttributeError):
        return response.text[:200]


def build_app(store: str | None = None) -> App:
    """The example application; `store` defaults to ``$SASFLOW_STORE``."""
    app = App(store=store)

    # E4: each agent gets the order's id and reads from the order what it needs.
    @app.agent("inventory", **_AGENT_OPTIONS)
    async def reserve(req: AgentRequest) -> Any:
        return await call_remote("reserve", req, {"order_id": req.input["order_id"]})

    @reserve.compensator
    async def release(req: AgentRequest) -> Any:
        return await call_remote("release", req, {"order_id": req.input["order_id"]})

    @app.agent("payments", **_AGENT_OPTIONS)
    async def charge(req: AgentRequest) -> Any:
        order = read_order(req.task_id)
        return await call_remote("charge", req, {"order_id": order["order_id"],
                                                 "amount": order["amount"],
                                                 "card": order["card"]})

    @charge.compensator
    async def refund(req: AgentRequest) -> Any:
        order = read_order(req.task_id)
        return await call_remote("refund", req, {"order_id": order["order_id"],
                                                 "amount": order["amount"]})

    @app.agent("shipping", **_AGENT_OPTIONS)
    async def ship(req: AgentRequest) -> Any:
        return await call_remote("ship", req, {"order_id": req.input["order_id"]})

    app.workflow(
        WORKFLOW,
        steps=[Step("reserve", agent="inventory", timeout=2.0),
               Step("charge", agent="payments", timeout=2.0),
               Step("ship", agent="shipping", timeout=2.0)],
        max_failures=3,
        on_failure="compensate",
        retry_backoff=0.1,  # an expired step is claimable again 0.1 s, 0.2 s... later
    )
    return app


app = build_app()
