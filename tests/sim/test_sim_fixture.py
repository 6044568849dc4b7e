"""The `sasflow_sim` fixture as a user's own tests would use it (docs/testing.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
    """Killed right after charging, the order still ships, charged once, recovered when
    the dead worker's heartbeat lease lapsed rather than at the five-minute timeout."""
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
    assert sim.elapsed < 300  # virtual seconds: before the charge's complete-by (R2)


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


def test_the_docs_example_passes_in_a_project_of_its_own(tmp_path: Path) -> None:
    """docs/testing.md's example, saved as a user's test file outside this repository,
    passes under plain pytest: the fixture comes from sasflow's installed plugin."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    example = re.findall(r"```python\n(.*?)```", docs, flags=re.DOTALL)[0]
    (tmp_path / "test_orders.py").write_text(example)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "asyncio_default_fixture_loop_scope=function", "test_orders.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
