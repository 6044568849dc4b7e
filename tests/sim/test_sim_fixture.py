"""The `sasflow_sim` fixture as a user's own tests would use it (docs/testing.md)."""

from __future__ import annotations

from collections.abc import Callable

from sasflow import App, PermanentError, Step
from sasflow.agent import AgentRequest
from sasflow.testing import SimulatedApp, failpoints

# ---- the user's application, as they declare it in production
ledger: list[tuple[str, str]] = []  # (what, idempotency key) the "bank" applied


def shop() -> App:
    app = App()

    @app.agent("payments")
    async def charge(req: AgentRequest) -> dict[str, int]:
        if ("charge", req.idempotency_key) not in ledger:
            ledger.append(("charge", req.idempotency_key))
        return {"charged": req.input["amount"]}

    @charge.compensator
    async def refund(req: AgentRequest) -> None:
        if ("refund", req.idempotency_key) not in ledger:
            ledger.append(("refund", req.idempotency_key))

    @app.agent("shipping")
    async def ship(req: AgentRequest) -> dict[str, str]:
        if req.input["address"] == "nowhere":
            raise PermanentError("no such address")
        return {"parcel": f"p-{req.task_id}"}

    app.workflow("order", [Step("charge", agent="payments", timeout=300.0),
                           Step("ship", agent="shipping", timeout=300.0)])
    return app


# ---- the user's tests


def test_an_order_survives_its_worker_dying_mid_charge(
        sasflow_sim: Callable[..., SimulatedApp]) -> None:
    """Killed right after charging, the order still ships, charged once, and the
    five-minute timeout costs no real time."""
    ledger.clear()
    sim = sasflow_sim(shop())
    sim.start_worker("w1")
    failpoints.arm("agent.after_call", failpoints.Crash(only=["w1"]))
    order = sim.submit("order", {"amount": 30, "address": "Main St 1"})
    sim.run_for(5)
    sim.start_worker("w2")  # the replacement systemd would start
    done = sim.wait(order)
    assert done.state.value == "processed"
    assert done.steps[1].result == {"parcel": f"p-{order}"}
    assert [what for what, _ in ledger] == ["charge"]
    assert sim.elapsed >= 300  # it waited out the charge's complete-by, virtually


def test_an_undeliverable_order_is_refunded_once(
        sasflow_sim: Callable[..., SimulatedApp]) -> None:
    """Shipping refuses for good: the charge is refunded, once, even with the refunding
    worker crashed half-way."""
    ledger.clear()
    sim = sasflow_sim(shop())
    sim.start_worker("w1")
    failpoints.arm("agent.before_reply", failpoints.Crash(only=["w1"], times=None))
    order = sim.submit("order", {"amount": 30, "address": "nowhere"})
    sim.run_for(1)
    sim.start_worker("w2")
    done = sim.wait(order)
    assert done.state.value == "compensated"
    assert [what for what, _ in ledger] == ["charge", "refund"]
    assert sim.alerts() == []
