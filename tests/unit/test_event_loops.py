"""The kind of loop sasflow's own loops are (event_loops.py): uvloop's where installed,
the standard library's when SASFLOW_EVENT_LOOP says so, and a one-line refusal of a
choice that cannot be had."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import uvloop

from sasflow import App, Step, event_loops
from sasflow.background_loop import BackgroundLoop
from sasflow.errors import ConfigurationError


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _background_loop_kind() -> type:
    background = BackgroundLoop()
    try:
        return type(background.run(_running_loop()))
    finally:
        background.close()


def test_by_default_the_blocking_methods_loop_is_uvloops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loops.VARIABLE, raising=False)
    assert _background_loop_kind() is uvloop.Loop


def test_the_standard_librarys_loop_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loops.VARIABLE, "asyncio")
    kind = _background_loop_kind()
    assert issubclass(kind, asyncio.BaseEventLoop) and not issubclass(kind, uvloop.Loop)


def test_an_apps_roles_run_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """`app.start()` runs the roles on the background loop: an async agent sees it."""
    seen: dict[str, type] = {}
    for choice, expected in (("auto", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)):
        monkeypatch.setenv(event_loops.VARIABLE, choice)
        app = App(store=f"sqlite:///{tmp_path / choice}.db")

        @app.agent("probe")
        async def probe(req: object, choice: str = choice) -> str:
            seen[choice] = type(asyncio.get_running_loop())
            return "ok"

        app.workflow("probe", steps=[Step("probe", agent="probe")])
        app.start()
        try:
            assert app.wait(app.submit("probe"), timeout=30).state.value == "processed"
        finally:
            app.stop()
        assert issubclass(seen[choice], expected)
    assert not issubclass(seen["asyncio"], uvloop.Loop)


def test_app_run_serves_on_uvloop(tmp_path: Path) -> None:
    """`app.run()` (what `sasflow worker` runs) makes its loop the same way: its agent
    reports the loop's kind, then stops the process the way an operator would."""
    script = textwrap.dedent(f"""
        import asyncio, os, signal
        from sasflow import App, Step
        app = App(store="sqlite:///{tmp_path / 'run.db'}")

        @app.agent("probe")
        async def probe(req):
            loop = type(asyncio.get_running_loop())
            print(loop.__module__ + "." + loop.__qualname__, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return "ok"

        app.workflow("probe", steps=[Step("probe", agent="probe")])
        app.submit("probe")
        app.run()
        print("stopped", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if k != event_loops.VARIABLE}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    assert done.stdout.split() == ["uvloop.Loop", "stopped"]


@pytest.mark.parametrize("choice", ["trio", "uv-loop", "1"])
def test_an_unknown_choice_is_refused_in_one_line_and_starts_nothing(
        monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    monkeypatch.setenv(event_loops.VARIABLE, choice)
    background = BackgroundLoop()
    with pytest.raises(ConfigurationError) as refused:
        background.run(_running_loop())
    message = str(refused.value)
    assert "\n" not in message and "SASFLOW_EVENT_LOOP" in message and choice in message
    assert background.started is None  # no loop, no thread


def test_uvloop_asked_for_and_missing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loops.VARIABLE, "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now fails
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        event_loops.loop_factory()
    coroutine = _running_loop()
    with pytest.raises(ConfigurationError):
        event_loops.run(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # never started


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loops.VARIABLE, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert event_loops.loop_factory() is asyncio.new_event_loop
    assert not isinstance(event_loops.run(_running_loop()), uvloop.Loop)
