"""Commands that run things: ``demo``, ``worker`` and ``submit`` (U1, U3, U5)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click
from click.core import ParameterSource

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
from sasflow.logs import LOG_FORMATS, configure_logging, log_context
from sasflow.redact import redact
from sasflow.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_HEARTBEAT,
    ROLES,
    check_instance_id,
    default_instance_id,
)

__all__ = ["Reporting", "demo", "log_format_of", "log_format_option", "submit", "worker"]

log = logging.getLogger("sasflow.cli")

F = TypeVar("F", bound=Callable[..., Any])

_LOG_LEVELS = ("debug", "info", "warning", "error")
# allocations between two collections of a `sasflow worker`'s youngest generation
# (Python's default is 700): see _settle_collector
DEFAULT_GC_THRESHOLD = 10_000
# the demo prints its own progress: of its own log, only what went wrong
_DEMO_LOG_LEVEL = "warning"


@dataclass(slots=True)
class Reporting:
    """How a command reports: its log lines and its one error line, "text" or "json".

    `sasflow.cli.run` hands one to the root group as click's ``obj``; the group sets
    it from ``sasflow --log-format``, and ``worker`` and ``demo`` from their own
    option when given, so that a failed command's error line is written as its
    log is.
    """

    log_format: str = "text"


def log_format_option(f: F) -> F:
    return option("--log-format", type=click.Choice(LOG_FORMATS, case_sensitive=False),
                  envvar="SASFLOW_LOG_FORMAT",
                  help="Log lines, and the error line, as text or as one JSON object each"
                       " (default: as given to sasflow --log-format, text).")(f)


def log_format_of(ctx: click.Context, given: str | None) -> str:
    """The command's log format: its own option's if given, else the group's."""
    reporting = ctx.find_object(Reporting)
    if reporting is None:  # run without the group
        reporting = ctx.ensure_object(Reporting)
    elif ctx.get_parameter_source("log_format") is ParameterSource.ENVIRONMENT:
        # the group read the variable too, unless its own option overrode it
        return reporting.log_format
    if given is not None:
        reporting.log_format = given
    return reporting.log_format


@click.command()
@option("--orders", type=click.IntRange(min=1), help="How many orders to submit (default: 200).")
@option("--workers", type=click.IntRange(min=1),
        help="How many worker processes to run (default: 3).")
@option("--chaos", is_flag=True, help="Kill and restart workers while the orders run.")
@option("--store", metavar="URL", envvar="SASFLOW_STORE",
        help="State store URL (default: a fresh SQLite file for the demo).")
@log_format_option
@click.pass_context
def demo(ctx: click.Context, orders: int | None, workers: int | None, chaos: bool,
         store: str | None, log_format: str | None) -> None:
    """Run the order-processing example, showing progress."""
    log_format = log_format_of(ctx, log_format)
    configure_logging(_DEMO_LOG_LEVEL, log_format)
    try:  # imported here: the demo pulls in its HTTP service, which other commands never need
        from sasflow.examples.orders.demo import run_demo
    except ImportError as error:
        raise ConfigurationError(f"the order-processing demo cannot be loaded: {error}"
                                 ) from error
    # the demo keeps its own defaults for what was not given
    given = (("orders", orders), ("workers", workers))
    sizes: dict[str, Any] = {k: v for k, v in given if v is not None}
    # its worker processes inherit this process's environment: they log as it does
    with _environment("SASFLOW_LOG_FORMAT", log_format):
        status = run_demo(chaos=chaos, store=store, **sizes)
    ctx.exit(status)


class _CommaSeparated(click.types.StringParamType):
    """Text; a repeatable option's variable holds its values comma-separated."""

    name = "URL"
    envvar_list_splitter = ","


_URLS = _CommaSeparated()


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
@option("--alert-webhook", "alert_webhooks", metavar="URL", multiple=True, type=_URLS,
        envvar="SASFLOW_ALERT_WEBHOOKS",
        help="POST every alert, signed, to this http(s) URL; repeatable (in the variable:"
             " comma-separated). The supervisors' leader sends them.")
@option("--alert-webhook-secret", metavar="SECRET", envvar="SASFLOW_ALERT_WEBHOOK_SECRET",
        help="The shared secret that signs the alert POSTs (HMAC-SHA256). Give it through"
             " the variable: any user of the host can read a command line.")
@option("--metrics-port", metavar="PORT", type=click.IntRange(0, 65535),
        envvar="SASFLOW_METRICS_PORT",
        help="Serve this worker's Prometheus metrics over HTTP on this port, at /metrics"
             " (0: any free port, logged; default: no metrics).")
@option("--metrics-host", metavar="ADDRESS", default="127.0.0.1", show_default=True,
        envvar="SASFLOW_METRICS_HOST",
        help="Address the metrics listen on; another than loopback exposes them, with no"
             " authentication, to the network.")
@option("--gc-threshold", metavar="OBJECTS", type=click.IntRange(min=1),
        default=DEFAULT_GC_THRESHOLD, show_default=True, envvar="SASFLOW_GC_THRESHOLD",
        help="Allocations between two collections of the youngest generation of Python's"
             " garbage collector (Python's default: 700).")
@option("--log-level", type=click.Choice(_LOG_LEVELS, case_sensitive=False), default="info",
        show_default=True, envvar="SASFLOW_LOG_LEVEL", help="Logging threshold (to stderr).")
@log_format_option
@click.pass_context
def worker(ctx: click.Context, app_ref: AppRef, roles: tuple[str, ...],
           agents: tuple[str, ...] | None, concurrency: int, store: str | None,
           transport: str | None, instance_id: str | None, supervisor_interval: float,
           heartbeat: float, heartbeat_lease: float | None,
           alert_webhooks: tuple[str, ...], alert_webhook_secret: str | None,
           metrics_port: int | None, metrics_host: str, gc_threshold: int, log_level: str,
           log_format: str | None) -> None:
    """Run APP's scheduler, agents and supervisor until SIGINT or SIGTERM."""
    configure_logging(log_level, log_format_of(ctx, log_format))
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
    _settle_collector(gc_threshold)
    # until the event loop installs its own handlers, SIGTERM stops us like SIGINT does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    with log_context(instance=name):  # its first and last lines too, not only its roles'
        try:
            log.info("worker %s starting: app %s, roles %s, agents %s, store %s, transport %s",
                     name, app_ref, ",".join(roles), ",".join(agents or app.agents),
                     redact(app.store_url or DEFAULT_STORE),
                     redact(app.transport_url or "memory"))
            app.run(roles=roles, agents=agents, concurrency=concurrency,
                    supervisor_interval=supervisor_interval, instance_id=name,
                    heartbeat=heartbeat, heartbeat_lease=heartbeat_lease,
                    alert_webhooks=alert_webhooks, alert_webhook_secret=alert_webhook_secret,
                    metrics_port=metrics_port, metrics_host=metrics_host)
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


def _settle_collector(threshold: int) -> None:
    """Python's garbage collector, set for a process that only runs roles.

    A scheduler driving a thousand tasks allocates fast, and most of what it
    allocates outlives a young collection (the tasks in flight): with Python's
    default of a collection every 700 allocations, collecting took about a sixth
    of such a process's time (docs/benchmarks.md). What is loaded by now (sasflow,
    the app, their libraries) lives as long as the process: it is frozen out of
    every later collection. An application running the roles in its own process
    (`app.run`, `app.start`) keeps its own settings: that process is not ours.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(threshold, middle, oldest)


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


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` in this process's environment while it lasts."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _root_cause(error: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error

