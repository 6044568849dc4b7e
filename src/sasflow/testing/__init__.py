"""Crash-test workflows: failpoints in the actors, virtual time, a simulated world (R6).

- `failpoints`: named points in the scheduler, agents and supervisor where a
  test can raise, crash the instance (as SIGKILL would) or pause it.
- `SimulatedApp` (and the pytest fixture `sasflow_sim`): run an App's workers
  on a virtual clock over an in-memory store and transport; crash, pause and
  restart them; wait for tasks without waiting in real time.
- `python -m sasflow.testing.sim`: seeded fault schedules against the real
  actors, with the invariants checked after each run.

Importing this package is cheap: the actors import `failpoints` from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sasflow.testing import failpoints

if TYPE_CHECKING:
    from sasflow.testing.harness import SimulatedApp

__all__ = ["SimulatedApp", "failpoints"]


def __getattr__(name: str) -> Any:
    # the harness imports the App, which imports the actors, which import this
    # package: load it only when asked for
    if name == "SimulatedApp":
        from sasflow.testing.harness import SimulatedApp

        return SimulatedApp
    raise AttributeError(name)
