"""The command surface: --help, environment variables for every option, the entry points."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from sasflow.cli import cli as root
from support.cli import Cli


def commands(ctx: click.Context) -> Iterator[click.Context]:
    """Every command's context under `ctx`, with click's automatic env var prefixes."""
    yield ctx
    if isinstance(ctx.command, click.Group):
        for name, command in ctx.command.commands.items():
            yield from commands(click.Context(command, info_name=name, parent=ctx))


def test_help_lists_the_commands(cli: Cli) -> None:
    result = cli("--help")
    assert result.status == 0 and result.err == ""
    listed = result.out.split("Commands:")[1].split()
    for command in ("demo", "worker", "submit", "tasks", "alerts"):
        assert command in listed


def test_worker_help_names_its_environment_variables(cli: Cli) -> None:
    result = cli("worker", "--help")
    assert result.status == 0
    for name in ("SASFLOW_STORE", "SASFLOW_TRANSPORT", "SASFLOW_ROLES", "SASFLOW_AGENTS",
                 "SASFLOW_CONCURRENCY", "SASFLOW_INSTANCE_ID", "SASFLOW_SUPERVISOR_INTERVAL",
                 "SASFLOW_LOG_LEVEL"):
        assert f"env var: {name}" in " ".join(result.out.split()), name


def test_operator_help_names_app_store_and_json_variables(cli: Cli) -> None:
    for command in (["tasks", "--help"], ["tasks", "retry", "--help"],
                    ["alerts", "list", "--help"]):
        text = " ".join(cli(*command).out.split())
        for name in ("SASFLOW_APP", "SASFLOW_STORE"):
            assert f"env var: {name}" in text, (command, name)
    assert "env var: SASFLOW_JSON" in " ".join(cli("tasks", "show", "--help").out.split())


def test_every_option_of_every_command_shows_an_environment_variable() -> None:
    top = click.Context(root, info_name="sasflow", auto_envvar_prefix="SASFLOW")
    seen = 0
    for ctx in commands(top):
        for param in ctx.command.get_params(ctx):
            if not isinstance(param, click.Option) or not param.expose_value:
                continue  # --help and --version act at once; nothing to configure
            record = param.get_help_record(ctx)
            assert record is not None and "env var: SASFLOW_" in record[1], (
                ctx.command_path, param.name)
            seen += 1
    assert seen >= 25  # the walk did reach the commands' options


def test_options_are_read_from_environment_variables(
        cli: Cli, submit: Callable[..., str]) -> None:
    submit("restock", task_id="e-1")
    assert cli("tasks", "list", env={"SASFLOW_JSON": "1"}).json()[0]["task_id"] == "e-1"
    only_errors = cli("tasks", "list", "--json", env={"SASFLOW_TASKS_LIST_STATE": "error"})
    assert only_errors.json() == []


def test_console_script_and_module_entry_points_agree(cli: Cli) -> None:
    script = Path(sys.executable).parent / "sasflow"
    installed = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                               timeout=30, env=cli.env)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.startswith("sasflow ")
    assert cli("--version").out == installed.stdout


def test_demo_runs_the_order_example_and_exits_with_its_status(cli: Cli) -> None:
    result = cli("demo", "--orders", "4", "--workers", "1")
    assert result.status == 0, result.err
    assert "orders" in result.out
