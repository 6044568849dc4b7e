"""``sasflow serve`` (the HTTP API) and ``sasflow tokens new`` (its users) (SPEC U4)."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

import click

from sasflow.app import DEFAULT_STORE, App
from sasflow.cli.app_ref import AppRef, load_app
from sasflow.cli.commands import log_format_of, log_format_option
from sasflow.cli.options import app_option, option, store_option, transport_option
from sasflow.errors import MissingExtraError, SasflowError
from sasflow.logs import configure_logging
from sasflow.redact import redact

__all__ = ["serve", "tokens"]

log = logging.getLogger("sasflow.web")


@click.command(short_help="Serve the HTTP API for operators.")
@option("--host", default="127.0.0.1", show_default=True, envvar="SASFLOW_HOST",
        help="Address to listen on; another than loopback exposes the API to the network.")
@option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
        envvar="SASFLOW_PORT", help="Port to listen on.")
@option("--tokens-file", metavar="PATH", envvar="SASFLOW_API_TOKENS_FILE",
        help="The API's users, one NAME:ROLE:sha256:HEX per line (default: the lines in"
             " $SASFLOW_API_TOKENS). Make one with `sasflow tokens new NAME`.")
@option("--trace-url", metavar="TEMPLATE", envvar="SASFLOW_TRACE_URL",
        help="Link each task's page to its trace: a URL with {trace_id}, e.g."
             " http://jaeger:16686/trace/{trace_id} (the id derives from the task's).")
@app_option
@store_option
@transport_option
@option("--log-level", type=click.Choice(("debug", "info", "warning", "error"),
                                         case_sensitive=False),
        default="info", show_default=True, envvar="SASFLOW_LOG_LEVEL",
        help="Logging threshold (to stderr).")
@log_format_option
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, tokens_file: str | None,
          trace_url: str | None, app_ref: AppRef | None, store: str | None,
          transport: str | None, log_level: str, log_format: str | None) -> None:
    """Serve the HTTP API (/api/v1, OpenAPI at /api/v1/openapi.json) until SIGINT or
    SIGTERM. With --app, operators may also act on tasks (retry, compensate, cancel,
    submit): the application's workflows plan those changes."""
    try:
        import uvicorn

        from sasflow.web.app import create_app
        from sasflow.web.auth import Users
    except ModuleNotFoundError as error:
        raise MissingExtraError(
            f"`sasflow serve` needs {error.name}: pip install 'sasflow[web]'") from error
    users = Users.configured(tokens_file)  # before anything opens: a bad file is one line
    configure_logging(log_level, log_format_of(ctx, log_format))
    if app_ref is None:
        app = App(store=store or DEFAULT_STORE, transport=transport)
        app.configure(create=False)  # a wrong --store is an error, not a new empty store
    else:
        app = load_app(app_ref)
        app.configure(store=store, transport=transport)
    log.info("serving http://%s:%d/api/v1 for store %s", host, port,
             redact(app.store_url or DEFAULT_STORE))
    class Server(uvicorn.Server):
        # uvicorn's own handlers raise the signal again once it has shut down, so the
        # process would end by it: for an operator's SIGTERM a clean stop is status 0
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = Server(uvicorn.Config(
        create_app(app, users, trace_url=trace_url), host=host, port=port, log_config=None,
        log_level=log_level.lower(), access_log=False, server_header=False))
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        app.close()
    if not server.started:  # it never listened (the port is taken, say): uvicorn logged why
        raise SasflowError(f"could not serve on {host}:{port}")


@click.group()
def tokens() -> None:
    """The HTTP API's users and their bearer tokens."""


@tokens.command("new")
@click.argument("name")
@option("--role", type=click.Choice(("viewer", "operator")), default="viewer",
        show_default=True, help="A viewer reads; an operator also acts on tasks and alerts.")
def new(name: str, role: str) -> None:
    """Make a token for NAME: prints the token (give it to NAME; it is not kept) and
    the line that admits it, for SASFLOW_API_TOKENS or the --tokens-file."""
    from sasflow.web.auth import new_token

    token, line = new_token(name, role)
    click.echo(f"token: {token}")
    click.echo(f"line:  {line}")
