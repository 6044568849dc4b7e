"""The APP argument: where the command line finds the user's App.

Two spellings (CONTRACT "Command line"): ``module:attribute``, importable from
the current directory, and ``path/to/file.py:attribute``.

The app's folder (the current directory, or the file's top package's folder)
comes first on sys.path while the app is imported, so ``module:attribute``
means the user's module even where an installed one has the same name; then it
moves behind the installed packages, so that a ``redis.py`` lying beside the
app cannot stand in for the broker client sasflow imports later. The app's own
late imports of its neighbours still find them. A reference that is
malformed is a usage error, caught while parsing (exit 2); one that is
well-formed but cannot be loaded is a ConfigurationError (exit 1).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import click

from sasflow.app import App
from sasflow.errors import ConfigurationError

__all__ = ["APP_REF", "AppRef", "AppRefType", "load_app"]


@dataclass(frozen=True, slots=True)
class AppRef:
    """A parsed APP reference: a module name or a .py path, and a dotted attribute."""

    target: str
    attribute: str
    is_path: bool

    def __str__(self) -> str:
        return f"{self.target}:{self.attribute}"


def _dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def parse_app_ref(text: str) -> AppRef:
    """Split ``target:attribute``; ValueError says what is wrong with it."""
    # rpartition: a Windows path keeps its drive colon in the target
    target, colon, attribute = text.rpartition(":")
    if not colon or not target or not attribute:
        raise ValueError(f"{text!r} is not MODULE:ATTRIBUTE or PATH.py:ATTRIBUTE")
    if not _dotted(attribute):
        raise ValueError(f"{text!r}: {attribute!r} is not an attribute name")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    if is_path and not target.endswith(".py"):
        raise ValueError(f"{text!r}: a path must name a .py file")
    if not is_path and not _dotted(target):
        raise ValueError(f"{text!r}: {target!r} is not a module name")
    return AppRef(target=target, attribute=attribute, is_path=is_path)


class AppRefType(click.ParamType[AppRef, Any]):
    name = "APP"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> AppRef:
        if isinstance(value, AppRef):
            return value
        try:
            return parse_app_ref(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


APP_REF = AppRefType()


def load_app(ref: AppRef) -> App:
    """Import the module the reference names and return its App."""
    if ref.is_path:
        folder, module_name = _module_for_path(ref.target)
    else:
        folder, module_name = os.getcwd(), ref.target
    module = _import_first_from(folder, module_name, ref)
    if ref.is_path:
        _check_same_file(module, ref.target)
    found: Any = module
    for part in ref.attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(
                f"cannot load {ref}: module {module_name!r} has no attribute"
                f" {ref.attribute!r}") from None
    if not isinstance(found, App):
        raise ConfigurationError(
            f"cannot load {ref}: it is a {type(found).__name__}, not a sasflow App")
    return found


def _import_first_from(folder: str, module_name: str, ref: AppRef) -> ModuleType:
    """Import `module_name` with `folder` first on sys.path, then put `folder` last."""
    def elsewhere() -> list[str]:  # "" is the current directory (python -m puts it first)
        return [p for p in sys.path if os.path.abspath(p or os.curdir) != folder]

    sys.path[:] = [folder, *elsewhere()]
    try:
        return _import(module_name, ref)
    finally:
        sys.path[:] = [*elsewhere(), folder]


def _import(module_name: str, ref: AppRef) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigurationError(
                f"cannot load {ref}: no module named {missing!r}"
                " (looked in the current directory and sys.path)") from error
        raise ConfigurationError(f"cannot load {ref}: importing {module_name!r} failed:"
                                 f" {type(error).__name__}: {error}") from error
    except Exception as error:  # whatever the module's own code raised while importing
        raise ConfigurationError(f"cannot load {ref}: importing {module_name!r} failed:"
                                 f" {type(error).__name__}: {error}") from error


def _module_for_path(path: str) -> tuple[str, str]:
    """A .py file's top package's folder and its dotted module name.

    Walking up through packages (folders with an ``__init__.py``) keeps the
    file's own relative imports working.
    """
    full = os.path.realpath(path)
    if not os.path.isfile(full):
        raise ConfigurationError(f"cannot load {path}: no such file")
    stem = os.path.splitext(full)[0]
    if os.path.basename(stem) == "__init__":
        stem = os.path.dirname(stem)
    parts: list[str] = []
    folder = stem
    while True:
        folder, name = os.path.split(folder)
        parts.append(name)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            break
    if not all(p.isidentifier() for p in parts):
        raise ConfigurationError(f"cannot load {path}: {'.'.join(reversed(parts))!r} is not"
                                 " an importable module name")
    return folder, ".".join(reversed(parts))


def _check_same_file(module: ModuleType, path: str) -> None:
    # a file named like an installed module (json.py...) would import that module instead
    loaded = getattr(module, "__file__", None)
    wanted = os.path.realpath(path)
    if loaded is None or os.path.realpath(loaded) != wanted:
        raise ConfigurationError(
            f"cannot load {path}: its module name {module.__name__!r} is already taken by"
            f" {loaded or 'a built-in module'}; rename the file")
