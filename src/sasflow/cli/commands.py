"""Commands that run things: ``demo``, ``worker`` and ``submit`` (U1, U3)."""

from __future__ import annotations

import json
import logging
import signal
import sys
from types import FrameType
from typing import Any

import click

from sasflow.backends import DEFAULT_STORE
from sasflow.cli.app_ref import APP_REF, AppRef, load_app
from sasflow.cli.options import (
    CONNECT_WITHIN,
    CommaList,
    instance_name,
    option,
    store_option,
    transport_option,
)
from sasflow.errors import ConfigurationError, PayloadError, SasflowError
from sasflow.redact import RedactingFilter, redact
from sasflow.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_HEARTBEAT,
    ROLES,
    check_instance_id,
    default_instance_id,
)

__all__ = ["demo", "submit", "worker"]

log = logging.getLogger("sasflow.cli")

_LOG_LEVELS = ("debug", "info", "warning", "error")


@click.command()
@option("--orders", type=click.IntRange(min=1), help="How many orders to submit (default: 200).")
@option("--workers", type=click.IntRange(min=1),
        help="How many worker processes to run (default: 3).")
@option("--chaos", is_flag=True, help="Kill and restart workers while the orders run.")
@option("--store", metavar="URL", envvar="SASFLOW_STORE",
        help="State store URL (default: a fresh SQLite file for the demo).")
@click.pass_context
def demo(ctx: click.Context, orders: int | None, workers: int | None, chaos: bool,
         store: str | None) -> None:
    """Run the order-processing example, showing progress."""
    try:  # imported here: the demo pulls in its HTTP service, which other commands never need
        from sasflow.examples.orders.demo import run_demo
    except ImportError as error:
        raise ConfigurationError(f"the order-processing demo cannot be loaded: {error}"
                                 ) from error
    # the demo keeps its own defaults for what was not given
    given = (("orders", orders), ("workers", workers))
    sizes: dict[str, Any] = {k: v for k, v in given if v is not None}
    ctx.exit(run_demo(chaos=chaos, store=store, **sizes))


@click.command(short_help="Run APP's scheduler, agents and supervisor.")
@click.argument("app_ref", metavar="APP", type=APP_REF)
@option("--roles", type=CommaList(ROLES), default=",".join(ROLES), show_default=True,
        envvar="SASFLOW_ROLES", help="Which actors this process runs.")
@option("--agents", type=CommaList(), envvar="SASFLOW_AGENTS",
        help="Serve only these agents (default: every agent the app declares).")
@option("--concurrency", type=click.IntRange(min=1), default=DEFAULT_CONCURRENCY,
        show_default=True,
        envvar="SASFLOW_CONCURRENCY", help="Tasks one scheduler drives at once.")
@store_option
@transport_option
@option("--instance-id", metavar="ID", envvar="SASFLOW_INSTANCE_ID",
        help="This process's name in LockedBy, the history and its heartbeat; {host} stands"
             " for the host's name (default: host-pid-random).")
@option("--supervisor-interval", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
        default=1.0, show_default=True, envvar="SASFLOW_SUPERVISOR_INTERVAL",
        help="How often the supervisor sweeps for expired steps.")
@option("--heartbeat", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_HEARTBEAT, show_default=True, envvar="SASFLOW_HEARTBEAT",
        help="How often this worker records in the store that it is alive.")
@option("--heartbeat-lease", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
        envvar="SASFLOW_HEARTBEAT_LEASE",
        help="After this long without a heartbeat the worker counts as gone: its health"
             " check fails and supervisors release its tasks (default: 5 heartbeats).")
@option("--log-level", type=click.Choice(_LOG_LEVELS, case_sensitive=False), default="info",
        show_default=True, envvar="SASFLOW_LOG_LEVEL", help="Logging threshold (to stderr).")
def worker(app_ref: AppRef, roles: tuple[str, ...], agents: tuple[str, ...] | None,
           concurrency: int, store: str | None, transport: str | None,
           instance_id: str | None, supervisor_interval: float, heartbeat: float,
           heartbeat_lease: float | None, log_level: str) -> None:
    """Run APP's scheduler, agents and supervisor until SIGINT or SIGTERM."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # client libraries log their URLs too (R5)
        handler.addFilter(RedactingFilter())
    app = load_app(app_ref)
    if agents is not None:
        unknown = [a for a in agents if a not in app.agents]
        if unknown:
            raise click.BadParameter(
                f"{', '.join(map(repr, unknown))} not declared by {app_ref}"
                f" (declared: {', '.join(app.agents) or 'none'})", param_hint="'--agents'")
    app.configure(store=store, transport=transport)
    name = instance_name(instance_id) if instance_id else default_instance_id()
    try:
        check_instance_id(name)
    except ConfigurationError as error:
        raise click.BadParameter(str(error), param_hint="'--instance-id'") from None
    # until the event loop installs its own handlers, SIGTERM stops us like SIGINT does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        log.info("worker %s starting: app %s, roles %s, agents %s, store %s, transport %s",
                 name, app_ref, ",".join(roles), ",".join(agents or app.agents),
                 redact(app.store_url or DEFAULT_STORE), redact(app.transport_url or "memory"))
        app.run(roles=roles, agents=agents, concurrency=concurrency,
                supervisor_interval=supervisor_interval, instance_id=name,
                heartbeat=heartbeat, heartbeat_lease=heartbeat_lease)
    except KeyboardInterrupt:
        pass
    except SasflowError:
        raise
    except Exception as error:  # a role crashed: the log has the traceback, stderr one line
        log.exception("worker %s failed", name)
        raise _root_cause(error) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        app.close()
    log.info("worker %s stopped", name)


@click.command()
@click.argument("app_ref", metavar="APP", type=APP_REF)
@click.argument("workflow")
@option("--input", "input_text", metavar="JSON",
        help="The task's input as JSON; @FILE reads it from a file, - from stdin."
             "  [default: null]")
@option("--task-id", metavar="ID",
        help="The task's id; submitting the same id again is a no-op (default: random).")
@option("--reply-to", metavar="QUEUE", help="Queue to receive the task's status messages.")
@store_option
def submit(app_ref: AppRef, workflow: str, input_text: str | None, task_id: str | None,
           reply_to: str | None, store: str | None) -> None:
    """Submit a task of WORKFLOW; prints its id."""
    payload = _parse_input(input_text)
    app = load_app(app_ref)
    app.configure(store=store, connect_within=CONNECT_WITHIN)
    try:
        submitted = app.submit(workflow, payload, task_id=task_id, reply_to=reply_to)
    finally:
        app.close()
    click.echo(submitted)


def _parse_input(text: str | None) -> Any:
    if text is None:
        return None
    source = "--input"
    try:
        if text == "-":
            text, source = sys.stdin.read(), "--input from stdin"
        elif text.startswith("@"):
            source = f"--input file {text[1:]}"
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
    except OSError as error:
        raise PayloadError(f"cannot read {source}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise PayloadError(f"{source} is not UTF-8 text") from None

    def reject(constant: str) -> Any:  # NaN and Infinity are not JSON
        raise ValueError(f"{constant} is not valid JSON")

    try:
        return json.loads(text, parse_constant=reject)
    except ValueError as error:
        raise PayloadError(f"{source} is not valid JSON: {error}") from None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _root_cause(error: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error

