"""What an application declares: its agents (S3) and its workflows (S1).

The declarations are the one thing an application's client and its workers
share: the client validates submissions and plans operator actions with them,
the worker serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sasflow.agent import AgentFunction, AgentRequest
from sasflow.errors import ConfigurationError, UnknownWorkflowError
from sasflow.isolation import Isolation
from sasflow.plan import Plan
from sasflow.resilience import RetryPolicy
from sasflow.workflow import Step, Workflow

__all__ = ["Declarations", "plans_for"]

_DEFAULT_CONCURRENCY = 256  # an agent's calls at once, on the loop or in threads
_DEFAULT_PROCESSES = 8  # ... in worker processes, each one a Python process


def plans_for(workflows: Mapping[str, Workflow],
              agents: Mapping[str, AgentFunction]) -> dict[str, Plan]:
    """Each workflow's planner; a step can be compensated if its agent has an undo."""
    compensable = frozenset(n for n, a in agents.items() if a.undo is not None)
    return {name: Plan(wf, compensable) for name, wf in workflows.items()}


class Declarations:
    """The agents and workflows declared so far, by name."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentFunction] = {}
        self.workflows: dict[str, Workflow] = {}

    def agent(self, name: str, *, attempts: int, initial_wait: float, max_wait: float,
              failure_threshold: int, reset_timeout: float, concurrency: int | None,
              isolation: Isolation) -> Callable[[Callable[[AgentRequest], Any]], AgentFunction]:
        if not name or not isinstance(name, str):
            raise ConfigurationError(f"agent name must be a non-empty string, got {name!r}")
        if name in self.agents:
            raise ConfigurationError(f"agent {name!r} is declared twice", agent=name)
        try:
            policy = RetryPolicy(attempts=attempts, initial_wait=initial_wait, max_wait=max_wait)
        except ValueError as error:
            raise ConfigurationError(f"agent {name!r}: {error}", agent=name) from None
        if concurrency is None:
            concurrency = _DEFAULT_PROCESSES if isolation == "process" else _DEFAULT_CONCURRENCY

        def declare(fn: Callable[[AgentRequest], Any]) -> AgentFunction:
            declared = AgentFunction(
                name=name, handler=fn, retry=policy, failure_threshold=failure_threshold,
                reset_timeout=reset_timeout, isolation=isolation, concurrency=concurrency)
            self.agents[name] = declared
            return declared

        return declare

    def workflow(self, name: str, steps: Sequence[Step], *, max_failures: int,
                 on_failure: str, retry_backoff: float, park_for: float) -> Workflow:
        if name in self.workflows:
            raise ConfigurationError(f"workflow {name!r} is declared twice")
        declared = Workflow.declare(name, steps, agents=self.agents, max_failures=max_failures,
                                    on_failure=on_failure, retry_backoff=retry_backoff,
                                    park_for=park_for)
        self.workflows[name] = declared
        return declared

    def plans(self) -> dict[str, Plan]:
        return plans_for(self.workflows, self.agents)

    def known(self, workflow: str) -> Workflow:
        """The declared workflow, or UnknownWorkflowError naming those declared."""
        declared = self.workflows.get(workflow)
        if declared is None:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownWorkflowError(f"unknown workflow {workflow!r} (declared: {known})")
        return declared
