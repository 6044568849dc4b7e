"""A task submitted in a process whose own scheduler has a slot free is written
already claimed for it, in the submission's transaction, and driven at once
(Store.submit_claimed; client.py, scheduler.py): on every store, from the blocking
`submit`, from `asubmit` on the roles' own event loop and from `asubmit` on another
loop (a web app's, the roles in a background thread), which hands the task over to
the scheduler's loop.

The proof is in the history the store keeps: the claim is recorded at the very
moment of the submission (one transaction), by the app's scheduler, once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow import AgentRequest, App, Step, TaskState
from sasflow.errors import UnknownTaskError
from sasflow.store.records import HistoryEntry
from support.backends import STORES

STEP_TIMEOUT = 600.0  # nothing here is about a step running out of time
WAIT = 60.0


@pytest.fixture(params=sorted(STORES))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORES[request.param](tmp_path)


class Gate:
    """Held shut, the `hold` agent keeps its step (and its scheduler slot) busy;
    `entered` says the step is running."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()


@pytest.fixture
def gate() -> Iterator[Gate]:
    made = Gate()
    yield made
    made.open.set()


@pytest.fixture
def app(store_url: str, gate: Gate) -> Iterator[App]:
    made = App(store=store_url)

    @made.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        return {"reserved": req.input["n"]}

    @made.agent("hold")
    def hold(req: AgentRequest) -> None:
        gate.entered.set()
        assert gate.open.wait(WAIT)

    made.workflow("reserve", steps=[Step("reserve", agent="inventory", timeout=STEP_TIMEOUT),
                                    Step("again", agent="inventory", timeout=STEP_TIMEOUT)])
    made.workflow("held", steps=[Step("hold", agent="hold", timeout=STEP_TIMEOUT)])
    yield made
    made.stop()


def claims(history: list[HistoryEntry]) -> list[HistoryEntry]:
    return [h for h in history if h.step is None and (h.why or "").startswith("claimed")]


def started(app: App, concurrency: int) -> None:
    """The app's roles started, and its scheduler running: a first task has run."""
    app.start(concurrency=concurrency)
    first = app.submit("reserve", {"n": 0}, task_id="first")
    assert app.wait(first, timeout=WAIT).state is TaskState.PROCESSED


def claimed_with_submission(history: list[HistoryEntry]) -> bool:
    """Whether the task's one claim is recorded at its submission's moment (one
    transaction), by a scheduler, under epoch 1."""
    submitted = [h.at for h in history if h.why == "submitted"]
    [claim] = claims(history)
    assert claim.actor not in ("submit", "") and claim.epoch == 1
    return submitted == [claim.at]


def test_a_submission_beside_a_free_scheduler_is_claimed_with_it_from_any_loop(
        app: App) -> None:
    """Each task's one claim is recorded at its submission's moment, by the app's
    scheduler, and the task runs to the end; from another loop too."""
    started(app, concurrency=8)
    ids = [app.submit("reserve", {"n": n}, task_id=f"blocking-{n}") for n in range(3)]

    async def from_another_loop() -> list[str]:
        return [await app.asubmit("reserve", {"n": n}, task_id=f"async-{n}")
                for n in range(3)]

    ids += asyncio.run(from_another_loop())
    for task_id in ids:
        assert app.wait(task_id, timeout=WAIT).state is TaskState.PROCESSED
    assert [claimed_with_submission(app.history(t)) for t in ids] == [True] * 6


def test_submissions_from_another_loop_cancelled_on_their_way_lose_no_task_and_no_slot(
        app: App) -> None:
    """Many submissions in flight from another loop, their callers cancelled while the
    writes are on their way (and that loop then closed): each task written still
    reaches its scheduler and runs to the end (its step timeout is far beyond the
    wait, so none may be left to a supervisor), and no promised slot is kept: with 8
    slots, tasks submitted afterwards run too."""
    started(app, concurrency=8)
    n = 64

    async def cancelled_on_their_way() -> None:
        submissions = [asyncio.ensure_future(
            app.asubmit("reserve", {"n": i}, task_id=f"cut-{i}")) for i in range(n)]
        await asyncio.wait(submissions, return_when=asyncio.FIRST_COMPLETED)
        for submission in submissions:
            submission.cancel()
        await asyncio.gather(*submissions, return_exceptions=True)

    asyncio.run(cancelled_on_their_way())
    written = []
    for i in range(n):
        try:
            app.get(f"cut-{i}")
        except UnknownTaskError:
            continue
        written.append(f"cut-{i}")
    assert written  # at least the first to complete
    for task_id in written:
        assert app.wait(task_id, timeout=WAIT).state is TaskState.PROCESSED, task_id
    later = [app.submit("reserve", {"n": i}, task_id=f"later-{i}") for i in range(16)]
    for task_id in later:
        assert app.wait(task_id, timeout=WAIT).state is TaskState.PROCESSED


def test_an_async_submission_on_the_roles_loop_is_claimed_with_it(app: App) -> None:
    """`asubmit` in the loop that runs the roles (`arun`): claimed with its submission."""
    async def main() -> list[bool]:
        roles = asyncio.create_task(app.arun(concurrency=8))
        try:
            first = await app.asubmit("reserve", {"n": 0}, task_id="first")
            await app.await_(first, timeout=WAIT)  # the scheduler runs
            ids = [await app.asubmit("reserve", {"n": n}, task_id=f"async-{n}")
                   for n in range(3)]
            for task_id in ids:
                assert (await app.await_(task_id, timeout=WAIT)).state is TaskState.PROCESSED
            return [claimed_with_submission(await app.ahistory(t)) for t in ids]
        finally:
            roles.cancel()
            await asyncio.gather(roles, return_exceptions=True)

    assert asyncio.run(main()) == [True] * 3


def test_with_every_slot_taken_a_submission_waits_pending_for_the_claim_loop(
        app: App, gate: Gate) -> None:
    """No slot free: the task is stored as submitted (pending, epoch 0, nothing but its
    submission in its history), then claimed in the usual way once a slot frees."""
    app.start(concurrency=1)
    app.submit("held", {}, task_id="busy")
    assert gate.entered.wait(WAIT)  # the one slot is busy until the gate opens
    waited = app.submit("reserve", {"n": 1}, task_id="waiting")
    task = app.get(waited)
    assert (task.state, task.locked_by, task.epoch) == (TaskState.PENDING, None, 0)
    assert [h.why for h in app.history(waited)] == ["submitted"]
    gate.open.set()
    assert app.wait(waited, timeout=WAIT).state is TaskState.PROCESSED
    [claim] = claims(app.history(waited))
    assert claim.at > app.history(waited)[0].at
