"""Failpoints in the actors (sasflow.testing.failpoints), on a SimulatedApp."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from sasflow import App, PermanentError, Step
from sasflow.agent import AgentRequest
from sasflow.testing import SimulatedApp, failpoints


class Remote:
    """A remote service that applies each idempotency key once, and counts calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.applied: list[str] = []

    def call(self, req: AgentRequest, what: str) -> dict[str, str]:
        self.calls[what] += 1
        if req.idempotency_key not in self.applied:
            self.applied.append(req.idempotency_key)
        return {"done": what}


def order_app(remote: Remote, *, ship_timeout: float = 30.0) -> App:
    app = App()

    @app.agent("payments", attempts=2)
    async def charge(req: AgentRequest) -> dict[str, str]:
        return remote.call(req, f"charge {req.task_id}")

    @charge.compensator
    async def refund(req: AgentRequest) -> dict[str, str]:
        return remote.call(req, f"refund {req.task_id}")

    @app.agent("shipping", attempts=2)
    async def ship(req: AgentRequest) -> dict[str, str]:
        if req.input.get("ship") == "slow-then-refuse":
            if remote.calls[f"ship {req.task_id}"] == 0:
                remote.calls[f"ship {req.task_id}"] += 1
                await asyncio.sleep(1000)  # past the complete-by: the supervisor recovers
            raise PermanentError("no such address")
        return remote.call(req, f"ship {req.task_id}")

    app.workflow("order", [Step("charge", agent="payments", timeout=30.0),
                           Step("ship", agent="shipping", timeout=ship_timeout)])
    return app


@pytest.fixture(autouse=True)
def disarmed() -> None:
    failpoints.reset()


def test_every_failpoint_is_reached_by_the_actors() -> None:
    """Each named point is on a path the actors take: a saga with an expiry passes all."""
    remote = Remote()
    with SimulatedApp(order_app(remote)) as sim:
        for point in failpoints.POINTS:  # armed for nobody: counted, never fired
            failpoints.arm(point, failpoints.Raise(RuntimeError, only=["nobody"]))
        sim.start_worker("w1")
        task = sim.wait(sim.submit("order", {"ship": "slow-then-refuse"}))
        assert task.state.value == "compensated"
        assert sorted(failpoints.hits) == sorted(failpoints.POINTS)


def test_a_crash_after_the_remote_call_is_finished_by_another_instance_once() -> None:
    """SIGKILL between the remote's answer and the reply: the step is run again by the
    next instance once the dead one's heartbeat lease lapsed (before the step's
    complete-by, R2), under the same key, so it applies once."""
    remote = Remote()
    with SimulatedApp(order_app(remote)) as sim:
        sim.start_worker("w1")
        failpoints.arm("agent.after_call", failpoints.Crash(only=["w1"]))
        task_id = sim.submit("order", {}, task_id="o-1")
        sim.run_for(1)
        assert sim.get(task_id).state.value == "processing"
        sim.start_worker("w2")
        task = sim.wait(task_id)
        assert task.state.value == "processed"
        assert sim.elapsed < 30.0  # virtual seconds: before the charge step's complete-by
        history = sim.run(sim.app.ahistory(task_id))
        assert any("lost its heartbeat lease" in (h.why or "") for h in history)
        assert remote.calls["charge o-1"] >= 2
        assert len(remote.applied) == len(set(remote.applied)) == 2  # charge, ship: once each
        assert task.steps[0].attempts == 2


def test_an_error_before_applying_a_reply_is_recovered_by_the_supervisor() -> None:
    """A scheduler that fails between the reply and its write leaves the task to expire;
    the supervisor releases it and the step runs again."""
    remote = Remote()
    with SimulatedApp(order_app(remote)) as sim:
        sim.start_worker("w1")
        failpoints.arm("scheduler.before_apply_reply", failpoints.Raise(RuntimeError("boom")))
        task = sim.wait(sim.submit("order", {}, task_id="o-1"))
        assert task.state.value == "processed"
        assert (task.steps[0].attempts, task.failure_count) == (2, 1)


def test_a_paused_scheduler_is_fenced_out_when_it_goes_on() -> None:
    """SIGSTOP past the complete-by, then SIGCONT: the instance goes on with a stale
    claim; its write is refused and the unit is committed once, by the new owner."""
    remote = Remote()
    with SimulatedApp(order_app(remote)) as sim:
        sim.start_worker("w1")
        failpoints.arm("scheduler.before_apply_reply", failpoints.Pause(120.0, only=["w1"]))
        task_id = sim.submit("order", {}, task_id="o-1")
        sim.run_for(1)
        sim.start_worker("w2", roles=["scheduler", "agent", "supervisor"])
        task = sim.wait(task_id)
        sim.run_for(150)  # w1 wakes and tries its stale write
        completions = [e for e in sim.history(task_id)
                       if e.step == "charge" and e.to_state == "completed"]
        assert task.state.value == "processed"
        assert [e.actor for e in completions] == ["w2"]


def test_arming_an_unknown_point_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown failpoint 'scheduler\.nowhere'"):
        failpoints.arm("scheduler.nowhere", failpoints.Crash())
    assert not failpoints.ARMED


def test_a_sync_agent_runs_in_its_thread_while_virtual_time_waits() -> None:
    """A sync agent works under SimulatedApp: its thread's real time is not counted, so
    a 1 s step whose agent takes real milliseconds completes at virtual time ~0."""
    app = App()

    @app.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, int]:
        threading.Event().wait(0.05)  # real work in the agent's thread
        return {"reserved": 1}

    app.workflow("stock", [Step("reserve", agent="inventory", timeout=1.0)])
    with SimulatedApp(app) as sim:
        sim.start_worker("w1")
        task = sim.wait(sim.submit("stock", {}))
        assert task.state.value == "processed"
        assert task.steps[0].attempts == 1
        assert sim.elapsed < 1.0


def test_a_failed_write_does_not_leave_a_stale_snapshot_to_hand_back() -> None:
    """The store fails the write of a step's completion; stopping the worker then must not
    hand the task back as if that write had applied: no step is skipped."""
    remote = Remote()
    with SimulatedApp(order_app(remote)) as sim:
        sim.start_worker("w1")
        sim.fail_store_calls("apply")  # the charge's completion: not written
        task_id = sim.submit("order", {}, task_id="o-1")
        sim.run_for(1)
        sim.stop_worker("w1")
        sim.start_worker("w2")
        task = sim.wait(task_id)
        assert task.state.value == "processed"
        assert [(s.name, s.state.value) for s in task.steps] == [
            ("charge", "completed"), ("ship", "completed")]
        assert task.steps[0].result == {"done": "charge o-1"}


def test_the_testing_package_exports_what_the_docs_use() -> None:
    """`from sasflow.testing import SimulatedApp, failpoints` (docs/testing.md) works, and
    every point the docs list is a known failpoint."""
    import sasflow.testing

    assert sorted(sasflow.testing.__all__) == ["SimulatedApp", "failpoints"]
    for name in sasflow.testing.__all__:
        assert getattr(sasflow.testing, name) is not None
    docs = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    listed = re.findall(r"^\| `([a-z]+\.[a-z_]+)` \|", docs, flags=re.MULTILINE)
    assert listed == list(failpoints.POINTS)
