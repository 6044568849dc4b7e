"""How a request is authenticated: a bearer token (API clients), or the dashboard's
session cookie with its CSRF token (SPEC U4).

A session is made by logging in with a user's name and token. Its cookie holds
only a random id (HttpOnly: no script reads it; SameSite=Strict: no other site
sends it; Secure when served over TLS); the server keeps the session, so logging
out or restarting ends it. A request that changes something and comes with the
cookie must also carry the session's CSRF token in the `X-CSRF-Token` header,
which the dashboard's pages embed for their script and another site can neither
read nor set. A
bearer token needs none: a browser never sends one by itself.

Failed attempts, a bad login or a bad bearer token, are counted per client
address: past `FAILURES_ALLOWED` in `FAILURE_WINDOW_S`, that address is refused
with 429 until the window passes, so a token cannot be guessed at speed.
"""

from __future__ import annotations

import collections
import hmac
import secrets
import time
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException
from starlette.requests import Request

from sasflow.web.auth import Principal, Users

__all__ = ["COOKIE", "CSRF_HEADER", "FAILURES_ALLOWED", "FAILURE_WINDOW_S", "Guard",
           "Session", "authenticated"]

COOKIE = "sasflow_session"
CSRF_HEADER = "X-CSRF-Token"
FAILURES_ALLOWED = 10
FAILURE_WINDOW_S = 60.0
SESSION_S = 8 * 3600.0  # a session lasts a working day
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(slots=True)
class Session:
    principal: Principal
    csrf: str
    expires: float


@dataclass
class Guard:
    """The server's users, live sessions and failed attempts."""

    users: Users
    clock: collections.abc.Callable[[], float] = time.monotonic
    sessions: dict[str, Session] = field(default_factory=dict)
    failures: dict[str, collections.deque[float]] = field(default_factory=dict)

    # ------------------------------------------------------------ failed attempts
    def check_not_blocked(self, address: str) -> None:
        """429 if `address` failed too often lately."""
        recent = self._recent(address)
        if len(recent) >= FAILURES_ALLOWED:
            wait = max(1, int(recent[0] + FAILURE_WINDOW_S - self.clock()) + 1)
            raise HTTPException(429, f"too many failed attempts: try again in {wait}s",
                                headers={"Retry-After": str(wait)})

    def failed(self, address: str) -> None:
        self._recent(address).append(self.clock())

    def _recent(self, address: str) -> collections.deque[float]:
        recent = self.failures.setdefault(address, collections.deque())
        while recent and recent[0] <= self.clock() - FAILURE_WINDOW_S:
            recent.popleft()
        return recent

    # ------------------------------------------------------------ sessions
    def login(self, address: str, name: str, token: str) -> tuple[str, Session] | None:
        """A new session if `token` is `name`'s; None (and counted) if not."""
        self.check_not_blocked(address)
        principal = self.users.authenticate(token)
        if principal is None or principal.name != name:
            self.failed(address)
            return None
        session_id = secrets.token_urlsafe(32)
        session = Session(principal, secrets.token_urlsafe(32), self.clock() + SESSION_S)
        self.sessions[session_id] = session
        return session_id, session

    def session(self, session_id: str | None) -> Session | None:
        session = self.sessions.get(session_id) if session_id else None
        if session is not None and session.expires <= self.clock():
            self.sessions.pop(session_id or "", None)
            return None
        return session

    def logout(self, session_id: str | None) -> None:
        self.sessions.pop(session_id or "", None)


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def authenticated(request: Request, bearer: str | None) -> Principal | None:
    """Who `request` comes from, or None; 429 for an address that failed too often,
    403 for a session's change without its CSRF token."""
    guard: Guard = request.app.state.guard
    address = _address(request)
    if bearer is not None:
        guard.check_not_blocked(address)
        principal = guard.users.authenticate(bearer)
        if principal is None:
            guard.failed(address)
        return principal
    session = guard.session(request.cookies.get(COOKIE))
    if session is None:
        return None
    if request.method not in _SAFE:
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page")
    return session.principal
