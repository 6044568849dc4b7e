"""The public surface: the names CONTRACT.md promises, exported, importable and typed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import tomllib
import types
from importlib import resources
from pathlib import Path

import pytest

import sasflow
from sasflow.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]

# What CONTRACT.md's "Python API" section uses: the names it imports from sasflow,
# the request its agents receive, the task get/wait return, and the state names.
CONTRACT_NAMES = {"App", "Step", "PermanentError", "AgentRequest", "Task", "TaskState",
                  "StepState"}


def test_all_holds_the_contract_names() -> None:
    """Every name the contract's Python API uses is exported from `sasflow`."""
    assert set(sasflow.__all__) >= CONTRACT_NAMES


def test_all_is_exactly_the_public_namespace() -> None:
    """__all__ lists every public name of the package and nothing it does not define."""
    public = {name for name, value in vars(sasflow).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert set(sasflow.__all__) == public
    assert len(set(sasflow.__all__)) == len(sasflow.__all__)


def test_star_import_gives_every_exported_name() -> None:
    """`from sasflow import *` yields exactly __all__, each the package's own object."""
    namespace: dict[str, object] = {}
    exec("from sasflow import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(sasflow.__all__)
    for name, value in namespace.items():
        assert value is getattr(sasflow, name)


def test_the_readmes_import_line_works() -> None:
    """The README's `from sasflow import ...` lines name only exported names."""
    readme = (ROOT / "README.md").read_text()
    lines = re.findall(r"^from sasflow import (.+)$", readme, flags=re.MULTILINE)
    assert lines, "the README shows how to import sasflow"
    for line in lines:
        for name in (n.strip() for n in line.split(",")):
            assert name in sasflow.__all__, name


def test_errors_share_one_root() -> None:
    """Every exported error derives from SasflowError; PermanentError is raised by agents."""
    errors = [getattr(sasflow, n) for n in sasflow.__all__ if n.endswith(("Error", "Timeout"))]
    assert sasflow.PermanentError in errors
    for error in errors:
        assert issubclass(error, sasflow.SasflowError), error
    for refused in (sasflow.UnknownWorkflowError, sasflow.UnknownTaskError,
                    sasflow.PayloadError, sasflow.TaskConflictError,
                    sasflow.InvalidTransitionError):
        assert issubclass(refused, sasflow.InputError)  # "the caller must act"
    assert issubclass(sasflow.WaitTimeout, TimeoutError)


def test_app_has_the_contract_methods_and_async_twins() -> None:
    """App: agent, workflow, submit, get, wait, run, and awaitable twins of the I/O ones."""
    for name in ("agent", "workflow", "submit", "get", "wait", "run"):
        assert callable(getattr(sasflow.App, name)), name
    for name in ("asubmit", "aget", "await_", "arun"):
        assert inspect.iscoroutinefunction(getattr(sasflow.App, name)), name
    submit = inspect.signature(sasflow.App.submit).parameters
    assert {"workflow", "input", "task_id", "reply_to"} <= set(submit)
    workflow = inspect.signature(sasflow.App.workflow).parameters
    assert {"steps", "max_failures", "on_failure"} <= set(workflow)
    assert "timeout" in inspect.signature(sasflow.App.wait).parameters


def test_agent_request_and_task_have_the_contract_fields() -> None:
    """req.task_id/step/input/results/idempotency_key/complete_by/attempt/result; task fields."""
    for field in ("task_id", "step", "input", "results", "idempotency_key", "complete_by",
                  "attempt", "result"):
        assert hasattr(sasflow.AgentRequest, field), field
    task_fields = set(sasflow.Task.__struct_fields__)
    assert {"task_id", "workflow", "state", "locked_by", "complete_by", "failure_count",
            "steps"} <= task_fields
    assert inspect.signature(sasflow.Step).parameters.keys() >= {"name", "agent", "timeout"}


def test_default_store_is_sasflow_db_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """App() stores in $SASFLOW_STORE, else sqlite:///sasflow.db in the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SASFLOW_STORE", raising=False)
    app = sasflow.App()
    try:
        store = app._store
        assert isinstance(store, SQLiteStore)
        assert Path(store.path) == tmp_path / "sasflow.db"
    finally:
        app.close()
    monkeypatch.setenv("SASFLOW_STORE", f"sqlite:///{tmp_path / 'from-env.db'}")
    app = sasflow.App()
    try:
        store = app._store
        assert isinstance(store, SQLiteStore)
        assert Path(store.path) == tmp_path / "from-env.db"
    finally:
        app.close()


def test_py_typed_is_shipped() -> None:
    """The package carries its py.typed marker, inside what the wheel packages."""
    assert resources.files("sasflow").joinpath("py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packaged = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    marker = ROOT / "src" / "sasflow" / "py.typed"
    assert marker.is_file()
    assert any(marker.is_relative_to(ROOT / p) for p in packaged)


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(sasflow.__path__, "sasflow.")
                  if not m.name.endswith("__main__"))


@pytest.mark.parametrize("module", _modules())
def test_every_modules_all_names_exist(module: str) -> None:
    """Each module's __all__ names only things it defines (no stale exports)."""
    imported = importlib.import_module(module)
    for name in getattr(imported, "__all__", ()):
        assert hasattr(imported, name), f"{module}.__all__ names missing {name!r}"
