"""Options shared by several commands, each also an environment variable (STYLE 13).

Options without an explicit variable get one from click's automatic prefix:
``sasflow tasks list --limit`` reads ``SASFLOW_TASKS_LIST_LIMIT``. Every option
shows its variable in ``--help``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from sasflow.backends import DEFAULT_STORE
from sasflow.cli.app_ref import APP_REF, AppRef

__all__ = [
    "CONNECT_WITHIN",
    "CommaList",
    "Connection",
    "app_option",
    "connection_options",
    "instance_name",
    "option",
    "store_option",
    "transport_option",
]

F = TypeVar("F", bound=Callable[..., Any])

# Seconds an operator command waits to reach a server store: it answers in
# seconds with one line, where a worker waits for the store as long as it takes.
CONNECT_WITHIN = 5.0


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """click.option that always shows its environment variable in --help."""
    attrs.setdefault("show_envvar", True)
    return click.option(*decls, **attrs)


class CommaList(click.ParamType[tuple[str, ...], Any]):
    """``a,b,c`` -> ("a", "b", "c"); with `choices`, each item must be one of them."""

    name = "NAME,..."

    def __init__(self, choices: Sequence[str] | None = None) -> None:
        self.choices = tuple(choices) if choices is not None else None

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(dict.fromkeys(v.strip() for v in str(value).split(",") if v.strip()))
        if not items:
            self.fail("give at least one name", param, ctx)
        if self.choices is not None:
            unknown = [v for v in items if v not in self.choices]
            if unknown:
                self.fail(f"unknown {', '.join(map(repr, unknown))}"
                          f" (choose from {', '.join(self.choices)})", param, ctx)
        return items


def instance_name(template: str) -> str:
    """An instance id as given, with ``{host}`` replaced by this host's name.

    In a container the host name is the container's (a pod's name on Kubernetes),
    so one setting, ``SASFLOW_INSTANCE_ID={host}``, gives every replica its own id,
    which its health probe, run in the same container, finds again.
    """
    return template.replace("{host}", socket.gethostname())


def store_option(f: F) -> F:
    return option("--store", metavar="URL", envvar="SASFLOW_STORE",
                  help="State store: sqlite:///PATH or postgresql://... Overrides the app's"
                       f" own; without either, {DEFAULT_STORE}.")(f)


def transport_option(f: F) -> F:
    return option("--transport", metavar="URL", envvar="SASFLOW_TRANSPORT",
                  help="Message transport: memory (in-process, the default), amqp://...,"
                       " redis://... Overrides the app's own.")(f)


def app_option(f: F) -> F:
    return option("--app", "app_ref", metavar="APP", type=APP_REF, envvar="SASFLOW_APP",
                  help="The application, MODULE:ATTRIBUTE or PATH.py:ATTRIBUTE.")(f)


def connection_options(f: F) -> F:
    """--app and --store, accepted on a command group and on each of its commands."""
    return app_option(store_option(f))


@dataclass(frozen=True, slots=True)
class Connection:
    """Which app and store an operator command works on (from the group or the command)."""

    app_ref: AppRef | None = None
    store: str | None = None

    def merged(self, app_ref: AppRef | None, store: str | None) -> Connection:
        return Connection(app_ref=app_ref or self.app_ref, store=store or self.store)


@contextlib.contextmanager
def logging_disabled(level: int) -> Iterator[None]:
    """Log records up to `level` dropped while a one-line command runs, then logging as
    it was: a process that runs the command in-process keeps its own logging."""
    before = logging.root.manager.disable
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(before)
