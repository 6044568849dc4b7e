"""The client half of App: one naming rule for every blocking/async twin, the
internals kept private (their old public names deprecated, still working), and
the running half assembled without the App reaching into the Worker."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sasflow
from sasflow import AgentRequest, App, StatusEvent, Step, TaskState

SRC = Path(sasflow.__file__).parent
API_DOC = SRC.parents[1] / "docs" / "api.md"
CLIENT_OPERATIONS = ["submit", "get", "list", "history", "alerts", "retry", "compensate",
                     "cancel", "migrate", "dead_letters", "dead_letter", "purge_dead_letters"]
HANG_GUARD = 60.0


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    """One workflow of one step, `echo`, on this test's store file."""
    made = App(store=db_url)

    @made.agent("echo")
    def echo(req: AgentRequest) -> Any:
        return req.input

    made.workflow("echo", steps=[Step("echo", agent="echo", timeout=600.0)])
    yield made
    made.stop()


def test_every_client_operation_has_a_blocking_form_and_an_a_prefixed_coroutine() -> None:
    """`x()` blocks and `ax()` is its coroutine, for every client operation; `wait`'s
    coroutine is `await_` (await is a keyword) and `listen`'s is the async iterator
    `alisten`."""
    for name in CLIENT_OPERATIONS:
        blocking, coroutine = getattr(App, name), getattr(App, f"a{name}")
        assert not inspect.iscoroutinefunction(blocking), name
        assert inspect.iscoroutinefunction(coroutine), name
        assert blocking.__name__ == name, name
        assert (inspect.signature(blocking).parameters.keys()
                == inspect.signature(coroutine).parameters.keys()), name
    assert inspect.iscoroutinefunction(App.await_)
    assert not inspect.iscoroutinefunction(App.wait)
    assert App.wait.__name__ == "wait"
    assert not inspect.iscoroutinefunction(App.listen)
    assert not inspect.iscoroutinefunction(App.alisten)  # returns an async iterator


def test_the_blocking_twins_read_what_their_coroutines_read(app: App) -> None:
    """list, history and alerts, new as blocking methods, answer as alist, ahistory
    and aalerts do."""
    task_id = app.submit("echo", {"n": 1}, task_id="t-1")
    app.start()
    done = app.wait(task_id, timeout=HANG_GUARD)
    assert done.state is TaskState.PROCESSED
    listed = app.list(state="processed")
    assert [t.task_id for t in listed] == ["t-1"]
    history = app.history(task_id)
    task_states = [e.to_state for e in history if e.step is None]
    assert task_states[0] == "pending" and task_states[-1] == "processed"
    assert app.alerts() == []

    async def read() -> tuple[Any, ...]:
        return (await app.alist(state="processed"), await app.ahistory(task_id),
                await app.aalerts())

    with contextlib.closing(asyncio.new_event_loop()) as loop:
        alisted, ahistory, aalerts = loop.run_until_complete(read())
    assert [t.task_id for t in alisted] == ["t-1"]
    assert ahistory == history
    assert aalerts == []


def test_listen_blocks_and_alisten_awaits_the_same_statuses(app: App) -> None:
    """`for status in app.listen(q)` sees received ... processed, as `alisten` does."""
    app.start()
    app.submit("echo", 1, task_id="t-sync", reply_to="q-sync")
    seen = []
    with app.listen("q-sync") as statuses:
        for status in statuses:
            seen.append(status.event)
            if status.event is StatusEvent.PROCESSED:
                break
    assert seen[0] is StatusEvent.RECEIVED and seen[-1] is StatusEvent.PROCESSED

    async def follow() -> list[str]:
        await app.asubmit("echo", 2, task_id="t-async", reply_to="q-async")
        events: list[str] = []
        async with asyncio.timeout(HANG_GUARD), contextlib.aclosing(
                app.alisten("q-async")) as stream:
            async for status in stream:
                events.append(status.event)
                if status.event == "processed":
                    return events
        raise AssertionError("alisten() ended")

    with contextlib.closing(asyncio.new_event_loop()) as loop:
        events = loop.run_until_complete(follow())
    assert events[0] == "received" and events[-1] == "processed"


def test_listen_used_the_old_async_way_still_works_with_a_deprecation_warning(
        app: App) -> None:
    """`async for status in app.listen(q)` (listen was async) warns and still yields."""
    app.start()

    async def follow() -> list[str]:
        await app.asubmit("echo", 3, task_id="t-old", reply_to="q-old")
        events: list[str] = []
        listening = app.listen("q-old")
        async with asyncio.timeout(HANG_GUARD), contextlib.aclosing(listening):
            with pytest.warns(DeprecationWarning, match="alisten"):
                iterator = aiter(listening)
            async for status in iterator:
                events.append(status.event)
                if status.event == "processed":
                    return events
        raise AssertionError("listen() ended")

    with contextlib.closing(asyncio.new_event_loop()) as loop:
        assert loop.run_until_complete(follow())[-1] == "processed"


def test_the_old_public_internals_warn_and_still_work(app: App) -> None:
    """store, transport, plans(), new_task() and worker() are deprecated, not gone."""
    with pytest.warns(DeprecationWarning, match="App.store"):
        assert app.store is app._store
    with pytest.warns(DeprecationWarning, match="App.transport"):
        assert app.transport is app._transport
    with pytest.warns(DeprecationWarning, match=r"App.plans\(\)"):
        assert set(app.plans()) == {"echo"}
    with pytest.warns(DeprecationWarning, match=r"App.new_task\(\)"):
        assert app.new_task("echo", 1, task_id="n-1").task_id == "n-1"
    with pytest.warns(DeprecationWarning, match=r"App.worker\(\)"):
        worker = app.worker(roles=["scheduler"], instance_id="w-1")
    assert worker.instance.instance_id == "w-1"
    assert worker.instance.workflows == {"echo": app.workflows["echo"].version}


def _imported(module: str) -> set[str]:
    """The modules `module` imports (read from its text: from X import ..., import X)."""
    text = (SRC / f"{module}.py").read_text()
    return set(re.findall(r"^\s*(?:from|import)\s+([\w.]+)", text, flags=re.MULTILINE))


def test_the_worker_gets_its_parts_not_the_app() -> None:
    """worker.py and running.py never import the App or its client: no import cycle."""
    for module in ("worker", "running", "declarations", "signals", "backends"):
        assert not {"sasflow.app", "sasflow.client"} & _imported(module), module
    parameters = inspect.signature(sasflow.worker.Worker).parameters
    assert {"store", "transport", "workflows", "agents", "settings"} <= parameters.keys()


@pytest.mark.parametrize("module", ["app", "client", "running", "worker", "declarations",
                                    "backends", "signals", "status_stream", "background_loop"])
def test_the_app_modules_stay_small(module: str) -> None:
    """Each module of the App's two halves is at most 400 lines."""
    assert len((SRC / f"{module}.py").read_text().splitlines()) <= 400


def test_docs_api_names_every_public_name_of_app() -> None:
    """docs/api.md, the App's reference, has a row for each of its public names."""
    documented = set(re.findall(r"`(?:@?app\.|await )?([a-z_]+)", API_DOC.read_text()))
    public = {name for name in dir(App) if not name.startswith("_")}
    assert public - documented == set()


def test_close_closes_the_transport_the_blocking_methods_opened(app: App) -> None:
    """A transport opened on the app's own loop (here by dead_letters()) is closed by
    close(); one opened in the caller's event loop is left to the caller."""
    assert app.dead_letters() == []
    opened = app._backends._transport
    assert opened is not None
    app.close()
    assert app._backends._transport is None

    async def use_in_my_loop() -> None:
        await app.adead_letters()

    with contextlib.closing(asyncio.new_event_loop()) as loop:
        loop.run_until_complete(use_in_my_loop())
        mine = app._backends._transport
        assert mine is not None  # opened in this loop
        app.close()
        assert app._backends._transport is mine
        loop.run_until_complete(mine.close())
