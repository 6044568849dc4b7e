"""The test suite's own layout stays as docs/testing.md describes it: what tests share
is imported from the support package, never from another test module or a conftest,
and nothing edits sys.path (pyproject's pytest pythonpath is the one place)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.append(node.module)
    return names


def edits_sys_path(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "path"
               and isinstance(node.value, ast.Name) and node.value.id == "sys"
               for node in ast.walk(tree))


def test_no_test_module_imports_another_or_edits_sys_path() -> None:
    modules = sorted(TESTS.rglob("*.py"))
    assert len(modules) > 50  # the walk sees the suite
    wrong: list[str] = []
    for path in modules:
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in imported(tree):
            last = name.rsplit(".", 1)[-1]
            if last.startswith("test_") or last == "conftest":
                wrong.append(f"{path.relative_to(TESTS)} imports {name}")
        if edits_sys_path(tree):
            wrong.append(f"{path.relative_to(TESTS)} uses sys.path")
    assert wrong == []
