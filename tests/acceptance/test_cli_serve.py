"""`sasflow serve` as an operator runs it: a real process on a loopback port, real
HTTP, the users from the environment; `sasflow tokens new` makes them (SPEC U4)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from support.cli import SHOP, Cli
from support.ports import free_port
from support.process import Process
from support.waiting import wait_for

COMMAND = [sys.executable, "-m", "sasflow.cli"]


def _token(cli: Cli, name: str, role: str) -> tuple[str, str]:
    made = cli("tokens", "new", name, "--role", role)
    assert made.status == 0, made.err
    token_line, config_line = made.out.splitlines()
    return token_line.removeprefix("token: "), config_line.removeprefix("line:  ")


def test_serve_answers_its_users_over_http_and_stops_on_sigterm(cli: Cli,
                                                                tmp_path: Path) -> None:
    operator_token, operator_line = _token(cli, "otto", "operator")
    viewer_token, viewer_line = _token(cli, "vera", "viewer")
    assert operator_token.startswith("sf_") and operator_token not in operator_line
    worker = cli.worker(SHOP)  # the store exists, and tasks run
    port = free_port()
    server = Process.spawn("serve", [*COMMAND, "serve", "--app", SHOP, "--port", str(port)],
                           tmp_path / "serve.log", cwd=cli.home,
                           env={**cli.env, "SASFLOW_API_TOKENS": f"{operator_line},{viewer_line}"})
    base = f"http://127.0.0.1:{port}/api/v1"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for("the server to answer", healthy, timeout=60, explain=server.tail)
    assert httpx.get(f"{base}/tasks", timeout=5).status_code == 401
    as_operator = {"Authorization": f"Bearer {operator_token}"}
    submitted = httpx.post(f"{base}/tasks", headers=as_operator, timeout=5,
                           json={"workflow": "order", "task_id": "web-1", "input": {}})
    assert submitted.status_code == 201, submitted.text
    cli.wait_for("web-1", "processed", worker)
    page = httpx.get(f"{base}/tasks", timeout=5,
                     headers={"Authorization": f"Bearer {viewer_token}"}).json()
    assert [t["task_id"] for t in page["tasks"]] == ["web-1"]
    document = httpx.get(f"{base}/openapi.json", timeout=5).json()
    assert "/api/v1/tasks/{task_id}/retry" in document["paths"]
    assert server.stop(signal.SIGTERM) == 0, server.tail()
    assert operator_token not in server.text()  # a token is never logged
    worker.stop()


def test_serve_without_users_is_one_clear_error(cli: Cli) -> None:
    refused = cli("serve", "--port", str(free_port()), env={"SASFLOW_API_TOKENS": ""})
    assert refused.status == 1
    assert "no API users" in refused.one_error_line()
    bad = cli("serve", "--port", str(free_port()), env={"SASFLOW_API_TOKENS": "eve:root"})
    assert bad.status == 1
    assert "NAME:ROLE:sha256:HEX" in bad.one_error_line()
