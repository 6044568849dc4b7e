"""The ``sasflow`` command line (CONTRACT "Command line", SPEC U1, U3, U5).

Noun-verb commands, every option also an environment variable. Exit status 0
on success, 2 on a usage error, 1 on any other failure; an error is one line on
stderr (``sasflow: error: ...``), never a traceback (set SASFLOW_DEBUG=1 to
see one for an unexpected error). With ``--log-format json`` that line is a
JSON object like the log's (``{"level": "error", "message": ...}``).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

import click

from sasflow.cli.commands import Reporting, demo, submit, worker
from sasflow.cli.db import db
from sasflow.cli.dead_letters import dead_letters
from sasflow.cli.health import healthcheck
from sasflow.cli.migrate import migrate_tasks
from sasflow.cli.operate import alerts, tasks
from sasflow.cli.options import option
from sasflow.cli.serve import serve, tokens
from sasflow.errors import SasflowError
from sasflow.logs import LOG_FORMATS, JsonFormatter
from sasflow.redact import redact_text

__all__ = ["cli", "main", "run"]

USAGE_ERROR = 2
FAILURE = 1


@click.group(context_settings={"auto_envvar_prefix": "SASFLOW",
                               "help_option_names": ["-h", "--help"],
                               "max_content_width": 100})
@click.version_option(package_name="sasflow", message="%(prog)s %(version)s")
@option("--log-format", type=click.Choice(LOG_FORMATS, case_sensitive=False), default="text",
        show_default=True, envvar="SASFLOW_LOG_FORMAT",
        help="Log lines (worker, demo), and any command's error line, as text or as one"
             " JSON object each.")
@click.pass_context
def cli(ctx: click.Context, log_format: str) -> None:
    """sasflow: durable, self-healing multi-step tasks (Scheduler-Agent-Supervisor).

    APP names your application: MODULE:ATTRIBUTE (importable from the current
    directory) or PATH.py:ATTRIBUTE.
    """
    ctx.ensure_object(Reporting).log_format = log_format
    if ctx.invoked_subcommand not in _LOGGING_COMMANDS:
        ctx.call_on_close(_quiet_client_libraries())


# commands that run actors and log what they do; the others answer in one line
_LOGGING_COMMANDS = ("worker", "demo", "serve")
_CLIENT_LIBRARIES = ("psycopg", "aio_pika", "aiormq", "redis")


def _quiet_client_libraries() -> Callable[[], None]:
    """Silence the client libraries for one command; returns what puts them back.

    Each failed connection attempt would print its own warning (a pool retrying
    for seconds printed ten): the command's one error line names the cause instead.
    Put back when the command ends, so a process that runs a command in-process
    (an application, a test) keeps its own logging as it was.
    """
    loggers = [logging.getLogger(name) for name in _CLIENT_LIBRARIES]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)

    def restore() -> None:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)

    return restore


for command in (demo, worker, submit, tasks, alerts, dead_letters, db, healthcheck, serve,
                tokens):
    cli.add_command(command)
tasks.add_command(migrate_tasks)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status instead of exiting."""
    reporting = Reporting()  # what the command chose by the time it failed

    def fail(message: str, status: int = FAILURE) -> int:
        return _fail(message, status, reporting.log_format)

    try:
        result = cli.main(args=argv, prog_name="sasflow", standalone_mode=False,
                          obj=reporting)
    except click.exceptions.NoArgsIsHelpError as error:  # `sasflow tasks`: show the help
        click.echo(error.format_message(), err=True)
        return USAGE_ERROR
    except click.UsageError as error:
        hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
        return fail(error.format_message().rstrip(".") + hint, USAGE_ERROR)
    except click.ClickException as error:
        return fail(error.format_message(), error.exit_code)
    except click.Abort:
        return fail("aborted")
    except KeyboardInterrupt:
        return fail("interrupted")
    except SasflowError as error:
        return fail(str(error))
    except OSError as error:
        if error.errno == errno.EPIPE:  # `sasflow tasks list | head`: the reader left
            _silence_stdout()
            return FAILURE
        return fail(str(error))
    except Exception as error:
        if os.environ.get("SASFLOW_DEBUG"):
            traceback.print_exc()
        return fail(f"unexpected {type(error).__name__}: {error}")
    # an int comes from ctx.exit(status) (the demo's status); commands return None
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script's entry point."""
    sys.exit(run(argv))


def _fail(message: str, status: int, log_format: str) -> int:
    # the last guard of R5: whatever raised, no URL in the line keeps its secrets
    one_line = " ".join(redact_text(message).split()) or "failed"
    if log_format == "json":  # shaped as a log line, so that a collector takes it as one
        record = logging.makeLogRecord({"name": "sasflow", "levelname": "ERROR",
                                        "levelno": logging.ERROR, "msg": one_line})
        click.echo(JsonFormatter().format(record), err=True)
    else:
        click.echo(f"sasflow: error: {one_line}", err=True)
    return status


def _silence_stdout() -> None:
    # the interpreter flushes stdout at exit, which would raise EPIPE again
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
