"""Workflow and step declarations: validated when made, with errors naming the culprit."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sasflow import App, ConfigurationError, Step
from sasflow.workflow import OnFailure, Workflow

AGENTS = ("inventory", "payments", "shipping")


def declare(steps: list[Step] | None = None, **options: Any) -> Workflow:
    steps = steps if steps is not None else [Step("reserve", "inventory"),
                                             Step("charge", "payments")]
    return Workflow.declare("process-order", steps, agents=AGENTS, **options)


@pytest.mark.parametrize("timeout", [0, -1, -0.5, math.nan, math.inf, "x", None])
def test_step_refuses_a_bad_timeout(timeout: Any) -> None:
    """A timeout that is not a positive finite number fails, naming the step and value."""
    with pytest.raises(ConfigurationError) as caught:
        Step("charge", "payments", timeout=timeout)
    message = str(caught.value)
    assert "'charge'" in message
    assert "timeout" in message
    assert repr(timeout) in message
    assert caught.value.step == "charge"


@pytest.mark.parametrize("name", ["", None, 7])
def test_step_refuses_a_bad_name(name: Any) -> None:
    """A step needs a non-empty string name."""
    with pytest.raises(ConfigurationError, match="step name"):
        Step(name, "payments")


def test_step_accepts_integer_and_fractional_timeouts() -> None:
    """Any positive finite number of seconds is a valid complete-by window."""
    assert Step("a", "inventory", timeout=1).timeout == 1
    assert Step("a", "inventory", timeout=0.05).timeout == 0.05


def test_unknown_agent_is_named_with_the_declared_ones() -> None:
    """A step naming an undeclared agent fails, naming workflow, step, agent and choices."""
    with pytest.raises(ConfigurationError) as caught:
        declare([Step("reserve", "inventory"), Step("charge", "paymnets")])
    message = str(caught.value)
    assert "'process-order'" in message
    assert "'charge'" in message
    assert "'paymnets'" in message
    assert "inventory, payments, shipping" in message
    assert (caught.value.step, caught.value.agent) == ("charge", "paymnets")


def test_duplicate_step_name_is_refused() -> None:
    """Two steps with one name would share state and idempotency keys: refused."""
    with pytest.raises(ConfigurationError, match="duplicate step name 'charge'") as caught:
        declare([Step("charge", "payments"), Step("charge", "shipping")])
    assert caught.value.step == "charge"


@pytest.mark.parametrize("policy", ["retry", "", "COMPENSATE ", "abort"])
def test_unknown_policy_is_refused_with_the_choices(policy: str) -> None:
    """on_failure must be one of the known policies; the error lists them."""
    with pytest.raises(ConfigurationError) as caught:
        declare(on_failure=policy)
    message = str(caught.value)
    assert f"unknown on_failure policy {policy!r}" in message
    assert "error" in message
    assert "compensate" in message


@pytest.mark.parametrize("max_failures", [0, -1, 1.5, "3", None])
def test_max_failures_below_one_or_not_an_integer_is_refused(max_failures: Any) -> None:
    """The supervisor threshold (E9) must be an integer >= 1."""
    with pytest.raises(ConfigurationError) as caught:
        declare(max_failures=max_failures)
    assert "max_failures" in str(caught.value)
    assert repr(max_failures) in str(caught.value)


@pytest.mark.parametrize(("option", "value"), [
    ("retry_backoff", -1), ("retry_backoff", math.nan), ("park_for", -0.1),
    ("park_for", "long")])
def test_negative_or_non_numeric_delays_are_refused(option: str, value: Any) -> None:
    """Backoff and park delays must be numbers >= 0."""
    with pytest.raises(ConfigurationError, match=option):
        declare(**{option: value})


def test_empty_workflow_and_non_step_entries_are_refused() -> None:
    """A workflow needs steps, each a Step."""
    with pytest.raises(ConfigurationError, match="has no steps"):
        declare([])
    with pytest.raises(ConfigurationError, match="is not a Step"):
        declare([("reserve", "inventory")])  # type: ignore[list-item]  # wrong on purpose
    with pytest.raises(ConfigurationError, match="workflow name"):
        Workflow.declare("", [Step("a", "inventory")], agents=AGENTS)


def test_a_valid_declaration_keeps_order_and_policy() -> None:
    """A valid workflow keeps its steps in order, its threshold and its policy."""
    wf = declare([Step("reserve", "inventory", 5), Step("charge", "payments", 10),
                  Step("ship", "shipping", 10)], max_failures=1, on_failure="error")
    assert [s.name for s in wf.steps] == ["reserve", "charge", "ship"]
    assert wf.max_failures == 1
    assert wf.on_failure is OnFailure.ERROR


def test_release_delay_doubles_and_is_capped() -> None:
    """The supervisor's release backoff: retry_backoff * 2**(n-1), at most a minute."""
    wf = declare(retry_backoff=0.5)
    assert [wf.release_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert wf.release_delay(30) == 60.0
    assert declare(retry_backoff=0).release_delay(5) == 0.0


def test_app_workflow_validates_against_its_declared_agents() -> None:
    """App.workflow refuses an agent the app has not declared, and a name used twice."""
    app = App()

    @app.agent("payments")
    def charge(req: Any) -> dict[str, str]:
        return {}

    with pytest.raises(ConfigurationError, match="unknown agent 'shipping'"):
        app.workflow("w", steps=[Step("ship", agent="shipping")])
    app.workflow("w", steps=[Step("charge", agent="payments")])
    with pytest.raises(ConfigurationError, match="'w' is declared twice"):
        app.workflow("w", steps=[Step("charge", agent="payments")])
    assert list(app.workflows) == ["w"]


def test_app_agent_refuses_duplicates_and_bad_retry_settings() -> None:
    """An agent name is declared once; its retry policy is validated at declaration."""
    app = App()
    app.agent("payments")(lambda req: None)
    with pytest.raises(ConfigurationError, match="'payments' is declared twice"):
        app.agent("payments")
    with pytest.raises(ConfigurationError, match="agent 'refunds'") as caught:
        app.agent("refunds", attempts=0)
    assert caught.value.agent == "refunds"
    with pytest.raises(ConfigurationError, match="agent name"):
        app.agent("")
