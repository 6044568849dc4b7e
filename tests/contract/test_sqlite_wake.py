"""Processes sharing one SQLite file wake each other instead of polling (sqlite_wake.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow import AgentRequest, App, Step, TaskState
from sasflow.store.sqlite.wake import WakeChannel

HANG_GUARD = 60.0  # a wait that long is a hang, never a claim about speed

# A second process on the store: it prints what the store's wake-ups tell it.
LISTENER = """
import sys, threading
from sasflow.store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
lock = threading.Lock()
def say(line):
    with lock:
        print(line, flush=True)
store.on_finished(lambda task_id: say(f"finished {task_id}"))
store._wake.on_work(lambda at: say(f"work {at}"))
say("ready")
sys.stdin.read()  # until the test closes our stdin
store.close_sync()
"""


@pytest.fixture
def listener(db_url: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", LISTENER, db_url.removeprefix("sqlite:///")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    yield process
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(timeout=HANG_GUARD) == 0
    process.stdout.close()


def test_another_process_hears_of_work_submitted_and_of_the_task_ending(
        db_url: str, listener: subprocess.Popen[str]) -> None:
    app = App(store=db_url)

    @app.agent("echo")
    async def echo(request: AgentRequest) -> dict[str, str]:
        return {"ok": "yes"}

    app.workflow("one", [Step("only", "echo", 600.0)])
    assert listener.stdout is not None
    # Submitted before this process runs any role, the task is left pending for
    # whichever process claims it, and the others are told. (With a scheduler of its
    # own running, a submission is claimed in its own transaction and tells nobody:
    # test_claim_at_submission.py.)
    task_id = app.submit("one", {}, task_id="heard")
    heard = [listener.stdout.readline().strip()]  # the listener's own pace: a hang guard
    assert heard[0].startswith("work "), heard
    app.start()
    try:
        assert app.wait(task_id, timeout=HANG_GUARD).state is TaskState.PROCESSED
    finally:
        app.stop()
    while heard[-1] != "finished heard":
        heard.append(listener.stdout.readline().strip())
    assert heard.count("finished heard") == 1


def test_a_channel_never_tells_itself_and_drops_a_dead_processes_socket(tmp_path: Path) -> None:
    db = str(tmp_path / "tasks.db")
    first, second = WakeChannel(db), WakeChannel(db)
    heard_first: list[str] = []
    first_heard, heard_second = threading.Event(), threading.Event()
    try:
        def first_hears(task_id: str) -> None:
            heard_first.append(task_id)
            first_heard.set()

        first.on_finished(first_hears)
        second.on_finished(lambda task_id: heard_second.set())
        # a process that died without unbinding: its socket file is left behind
        dead = os.path.join(first.directory, "1-deadbeef")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(dead)
        first.finished("t1")
        assert heard_second.wait(HANG_GUARD)
        assert not os.path.exists(dead)  # a refused send removes it
        # the first channel's own datagram went to the second only: had it gone to
        # itself too, it would have been queued on its socket before the second's
        second.finished("t2")
        assert first_heard.wait(HANG_GUARD)
        assert heard_first == ["t2"]
    finally:
        first.close()
        second.close()


def test_a_wake_directory_that_is_not_the_users_own_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "sasflow-wake").mkdir(mode=0o777)
    os.chmod(runtime / "sasflow-wake", 0o777)  # others may write: not private
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    channel = WakeChannel(str(tmp_path / "tasks.db"))
    try:
        channel.on_finished(lambda task_id: None)
        assert not os.path.exists(channel.directory)  # nothing bound there
        channel.finished("t1")  # telling nobody is not an error
    finally:
        channel.close()
