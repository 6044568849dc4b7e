"""How the HTTP API fails (SPEC U4, U7): a JSON body with a clear message, never a
stack trace, and a status that says who must act.

    {"error": {"status": 404, "code": "unknown_task", "message": "unknown task 'x'"}}

The error tree (errors.py) maps onto statuses: bad input is a 4xx (unknown ids
404, a state that forbids the action or a conflicting id 409, anything else
400), an unreachable store or transport 503; whatever else escapes is a 500 whose
message says only that, while the log has the traceback. A body over the limit
is refused with 413 before it is read whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sasflow.errors import (
    InputError,
    InvalidTransitionError,
    PayloadError,
    SasflowError,
    StoreError,
    TaskConflictError,
    TransportError,
    UnknownAlertError,
    UnknownTaskError,
    UnknownWorkflowError,
)
from sasflow.redact import redact_text

__all__ = ["BodyLimit", "error_response", "handlers"]

log = logging.getLogger("sasflow.web")

# (status, code) by the most specific class first
_STATUSES: list[tuple[type[SasflowError], int, str]] = [
    (UnknownTaskError, 404, "unknown_task"),
    (UnknownAlertError, 404, "unknown_alert"),
    (UnknownWorkflowError, 400, "unknown_workflow"),
    (TaskConflictError, 409, "task_conflict"),
    (InvalidTransitionError, 409, "invalid_transition"),
    (PayloadError, 400, "bad_payload"),
    (InputError, 400, "bad_input"),
    (StoreError, 503, "store_unavailable"),
    (TransportError, 503, "transport_unavailable"),
]
_CODES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 413: "payload_too_large", 422: "bad_request",
          429: "too_many_requests"}


def error_response(status: int, message: str, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"status": status, "code": code or _CODES.get(status, "error"),
            "message": " ".join(redact_text(message).split())}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


async def _sasflow_error(request: Request, error: Exception) -> JSONResponse:
    for kind, status, code in _STATUSES:
        if isinstance(error, kind):
            return error_response(status, str(error), code)
    return await _unexpected(request, error)


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    detail = error.detail if isinstance(error.detail, str) else "request refused"
    return error_response(error.status_code, detail, headers=error.headers)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    # FastAPI's RequestValidationError: one line naming each bad field
    problems: list[dict[str, Any]] = getattr(error, "errors", list)()
    said = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}:"
                     f" {e.get('msg', 'invalid')}" for e in problems[:5])
    return error_response(422, f"bad request: {said or 'invalid input'}")


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=error)
    return error_response(500, "internal error: the server's log has the details",
                          "internal")


def handlers() -> dict[Any, Any]:
    """Exception handlers for the FastAPI app, by exception class."""
    from fastapi.exceptions import RequestValidationError

    return {SasflowError: _sasflow_error, HTTPException: _http_error,
            RequestValidationError: _validation_error, Exception: _unexpected}


class BodyLimit:
    """Refuses a request body over `limit` bytes with 413: by its Content-Length at
    once, else (chunked) as soon as what arrived passes the limit. The body is read
    here, before any route sees it: a route reading it would turn the refusal into a
    parse error of its own."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(scope, receive, send)
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        given = False

        async def replay() -> Message:
            nonlocal given
            if given:
                return await receive()  # (a disconnect, when it comes)
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, f"request body over {self.limit} bytes")
        await response(scope, receive, send)
