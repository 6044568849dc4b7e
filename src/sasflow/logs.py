"""A sasflow process's log: text for people, or one JSON object a line for machines (U5).

`configure_logging(level, fmt)` sends the process's records to stderr, in one
of two formats:

- ``text``: ``%(asctime)s %(levelname)s %(name)s: %(message)s``, as always;
- ``json``: one object per line, ``ts`` (ISO-8601, UTC, with its offset),
  ``level``, ``logger``, ``message``, then ``task_id``, ``step``, ``epoch`` and
  ``instance`` whenever they are known, and ``exc`` (the traceback, one string)
  when the record carries an exception.

Those four fields are not passed to each log call: an actor sets them once
where it takes up a task (`log_context`; `log_step` as a driver moves on), and
`ContextFilter` copies them into every record logged meanwhile, by sasflow, the
client libraries or the application's agents. They live in context variables,
so each asyncio task (a scheduler's driver, an agent's handler) sees its own,
and a sync agent's thread sees its request's (agent.py runs it in a copy of
the context). An application that sets up its own logging can put
`ContextFilter` and `JsonFormatter` on its own handlers, before it starts the
roles: until a process has a ContextFilter, nothing reads the fields and the
contexts set none.

In both formats every message and traceback passes through `RedactingFilter`
first: no URL secret reaches the log (R5).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, TextIO, TypedDict, Unpack

from sasflow.redact import RedactingFilter, redact_text

__all__ = ["FIELDS", "LOG_FORMATS", "ContextFilter", "JsonFormatter", "LogFields",
           "configure_logging", "log_context", "log_handler", "log_step"]

LOG_FORMATS = ("text", "json")
FIELDS = ("task_id", "step", "epoch", "instance")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# one variable per field: the scheduler's per-step `log_step` is then one set
_VARS: dict[str, ContextVar[Any]] = {
    name: ContextVar(f"sasflow_log_{name}", default=None) for name in FIELDS}
_STEP: ContextVar[str | None] = _VARS["step"]

# Whether this process has a ContextFilter, the only reader of the variables. Until
# it has one, no record is given the fields, and setting them only costs: a driver's
# context and each agent request's, their tokens and context mappings, made some 15%
# of the collector's runs in the roles' process (docs/benchmarks.md).
_read = False


class LogFields(TypedDict, total=False):
    """What a record may be told of the work it was logged about."""

    task_id: str
    step: str
    epoch: int
    instance: str


class log_context:  # lower case: used as a function is, like contextlib.suppress
    """Within it, every record logged in this context, and in the asyncio tasks it
    starts, carries these fields besides those set already; on exit they are as
    they were."""

    __slots__ = ("_fields", "_tokens")
    _tokens: Sequence[Token[Any]]

    def __init__(self, **fields: Unpack[LogFields]) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        if not _read:
            self._tokens = ()
            return
        tokens = []  # a loop: cheaper than a comprehension, and an agent enters one a request
        for name, value in self._fields.items():
            tokens.append(_VARS[name].set(value))
        self._tokens = tokens

    def __exit__(self, *exc: object) -> None:
        for token in self._tokens:
            token.var.reset(token)


def log_step(step: str) -> None:
    """Records logged from now on in this context carry `step`, until it is set again.

    For a coroutine that runs as an asyncio task of its own and moves from step to
    step (a scheduler's driver): its context is its own copy, dropped with it, so
    nothing needs putting back, and a step costs one context variable's set.
    """
    if _read:
        _STEP.set(step)


class ContextFilter(logging.Filter):
    """Copies the fields of the current `log_context` onto each record it sees.

    A field the log call gave itself (``extra={"task_id": ...}``) is kept. Put it on
    a handler: a handler's filters run in the logging call's own context. The
    fields are kept from the first one's making on (contexts entered before it
    carry none): make it before the roles start, as `configure_logging` does.
    """

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        global _read
        _read = True

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        for name, var in _VARS.items():
            value = var.get()
            if value is not None:
                fields.setdefault(name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One record as one line of JSON (the fields are in the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:  # RedactingFilter does not look at the stack
            entry["stack"] = redact_text(self.formatStack(record.stack_info))
        # default=str: a field an application set to something JSON has no form for
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_handler(fmt: str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to `stream` (stderr) in `fmt`, "text" or "json", secrets masked."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    out = _SasflowHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        out.addFilter(ContextFilter())
        out.setFormatter(JsonFormatter())
    else:
        out.setFormatter(logging.Formatter(TEXT_FORMAT))
    out.addFilter(RedactingFilter())
    return out


def configure_logging(level: str, fmt: str) -> None:
    """Log this process's records of `level` ("info", "warning"...) and above to stderr,
    in `fmt`, "text" or "json".

    Calling it again replaces the handler it installed rather than adding a second.
    Handlers installed by others stay, each given a RedactingFilter: whatever
    writes the log, no URL secret reaches it (R5).
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _SasflowHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(log_handler(fmt))
    root.setLevel(level.upper())
    for other in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in other.filters):
            other.addFilter(RedactingFilter())


class _SasflowHandler(logging.StreamHandler[TextIO]):
    """The handler configure_logging installed, to be found again and replaced."""
