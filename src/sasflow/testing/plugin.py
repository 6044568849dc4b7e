"""The pytest plugin of sasflow.testing: the `sasflow_sim` fixture.

Installed with sasflow (a `pytest11` entry point), so any project's tests can
ask for it::

    def test_survives_a_crash(sasflow_sim):
        sim = sasflow_sim(app)          # app: your App, its store not opened yet
        sim.start_worker("w1")
        ...

Every SimulatedApp it made is closed after the test, and every failpoint
disarmed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sasflow.testing.harness import SimulatedApp

__all__ = ["sasflow_sim"]


@pytest.fixture
def sasflow_sim() -> Iterator[Callable[..., SimulatedApp]]:
    """A factory: `sasflow_sim(app, seed=0)` runs `app` on a virtual clock (SimulatedApp)."""
    from sasflow.testing.harness import SimulatedApp

    made: list[SimulatedApp] = []

    def make(app: Any, **options: Any) -> SimulatedApp:
        sim = SimulatedApp(app, **options)
        made.append(sim)
        return sim

    try:
        yield make
    finally:
        for sim in made:
            sim.close()
