"""Workflow and Step declarations (SPEC S1) and the policies a workflow chooses.

A workflow is a named, ordered pipeline of steps; each step names the agent that
carries it out and how long one dispatch of it may take (its complete-by window).
Declarations are validated when made, so a mistake fails at import, not at 3 a.m.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sasflow.errors import ConfigurationError

__all__ = ["OnFailure", "Step", "Workflow", "workflow_version"]


class OnFailure(enum.StrEnum):
    """What happens when a step fails for good (S6, S8)."""

    ERROR = "error"  # state error + an operator alert
    COMPENSATE = "compensate"  # undo the completed steps in reverse order
    PARK = "park"  # expiries only: wait `park_for` seconds, then retry


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a workflow: which agent runs it and its complete-by window."""

    name: str
    agent: str
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigurationError(f"step name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.timeout, int | float) or not math.isfinite(self.timeout) or (
            self.timeout <= 0
        ):
            raise ConfigurationError(
                f"step {self.name!r}: timeout must be a positive number of seconds,"
                f" got {self.timeout!r}",
                step=self.name,
            )


@dataclass(frozen=True, slots=True)
class Workflow:
    """A named pipeline of steps and its recovery policy."""

    name: str
    steps: tuple[Step, ...]
    max_failures: int = 3
    on_failure: OnFailure = OnFailure.COMPENSATE
    retry_backoff: float = 0.2  # supervisor release delay: retry_backoff * 2**(failures-1)
    park_for: float = 300.0

    @classmethod
    def declare(
        cls,
        name: str,
        steps: Sequence[Step],
        *,
        agents: Iterable[str],
        max_failures: int = 3,
        on_failure: str = "compensate",
        retry_backoff: float = 0.2,
        park_for: float = 300.0,
    ) -> Workflow:
        """Validate a declaration against the known agents and build the workflow."""
        if not name or not isinstance(name, str):
            raise ConfigurationError(f"workflow name must be a non-empty string, got {name!r}")
        if not steps:
            raise ConfigurationError(f"workflow {name!r} has no steps")
        known = set(agents)
        seen: set[str] = set()
        for step in steps:
            if not isinstance(step, Step):
                raise ConfigurationError(f"workflow {name!r}: {step!r} is not a Step")
            if step.name in seen:
                raise ConfigurationError(
                    f"workflow {name!r}: duplicate step name {step.name!r}", step=step.name
                )
            seen.add(step.name)
            if step.agent not in known:
                raise ConfigurationError(
                    f"workflow {name!r}: step {step.name!r} names unknown agent {step.agent!r}"
                    f" (declared agents: {', '.join(sorted(known)) or 'none'})",
                    step=step.name,
                    agent=step.agent,
                )
        try:
            policy = OnFailure(on_failure)
        except ValueError:
            choices = ", ".join(p.value for p in OnFailure)
            raise ConfigurationError(
                f"workflow {name!r}: unknown on_failure policy {on_failure!r} (choose {choices})"
            ) from None
        if not isinstance(max_failures, int) or max_failures < 1:
            raise ConfigurationError(
                f"workflow {name!r}: max_failures must be an integer >= 1, got {max_failures!r}"
            )
        for label, value in (("retry_backoff", retry_backoff), ("park_for", park_for)):
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(
                    f"workflow {name!r}: {label} must be a number >= 0, got {value!r}"
                )
        return cls(
            name=name,
            steps=tuple(steps),
            max_failures=max_failures,
            on_failure=policy,
            retry_backoff=float(retry_backoff),
            park_for=float(park_for),
        )

    @property
    def version(self) -> str:
        """What a task of this workflow depends on, as a short stable hash.

        Derived from the declaration's shape only: the workflow's name and its
        steps' names and agents, in order. A task records the version it was
        submitted under, and only workers that declare that version run it, so
        a release that reorders, renames or drops steps never meets a task
        planned for another shape. Timeouts and policies are not part of it:
        changing them leaves every task runnable.
        """
        return _shape_version(self.name, tuple((s.name, s.agent) for s in self.steps))

    def release_delay(self, failure_count: int) -> float:
        """How long a released task waits before it may be claimed again."""
        return min(60.0, self.retry_backoff * 2.0 ** max(0, failure_count - 1))


def workflow_version(name: str, steps: Sequence[tuple[str, str]]) -> str:
    """The version of a workflow with these (step, agent) pairs, in order (see `Workflow.version`).

    Also computed from a stored task's own steps, so tasks written before
    versions existed get theirs from what they hold.
    """
    return _shape_version(name, tuple((step, agent) for step, agent in steps))


@functools.lru_cache(maxsize=1024)
def _shape_version(name: str, steps: tuple[tuple[str, str], ...]) -> str:
    # cached: every submission and every decision asks, and a hash of JSON each time
    # was a measurable share of a submission's work; an application has few shapes
    shape = json.dumps([name, [list(s) for s in steps]], separators=(",", ":"))
    return hashlib.sha256(shape.encode()).hexdigest()[:12]
