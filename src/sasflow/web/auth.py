"""Who may call the operator surface, and as what (SPEC U4).

Nothing is anonymous but the health check. A caller presents a bearer token;
the server holds only each token's SHA-256, with its user's name and role:

    NAME:ROLE:sha256:HEX        one per line, in $SASFLOW_API_TOKENS or --tokens-file

`sasflow tokens new NAME --role ROLE` makes a token and prints that line. A
token is 32 random bytes, so one SHA-256 is as good as a slow password hash
against guessing, and costs a microsecond per request. The presented token's
digest is compared with every user's in constant time (hmac.compare_digest), all
of them each time, so neither the comparison nor which user matched shows in
the time taken.

Two roles: a `viewer` reads; an `operator` also acts (retry, compensate, cancel,
acknowledge, purge, submit). Each route declares the role it needs, and the
OpenAPI document says it (`x-sasflow-role`), so a test can walk every route.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from sasflow.errors import ConfigurationError

__all__ = ["OPERATOR", "ROLES", "VIEWER", "Principal", "Users", "new_token"]

VIEWER, OPERATOR = "viewer", "operator"
ROLES = (VIEWER, OPERATOR)  # each may do what those before it may
_NAME = r"[A-Za-z0-9_.@-]{1,64}"
_LINE = re.compile(rf"^(?P<name>{_NAME}):(?P<role>\w+):sha256:(?P<digest>[0-9a-f]{{64}})$")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    name: str
    role: str

    def may(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Users:
    """The users the server knows: name, role and their token's digest."""

    def __init__(self, users: list[tuple[Principal, bytes]]) -> None:
        self._users = users

    @classmethod
    def parse(cls, text: str, source: str) -> Users:
        """Users from lines of ``NAME:ROLE:sha256:HEX`` (blank lines and # comments
        skipped); ConfigurationError naming the bad line."""
        users: list[tuple[Principal, bytes]] = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            for entry in line.split(","):  # the environment variable holds one line
                found = _LINE.match(entry.strip())
                if found is None or found["role"] not in ROLES:
                    raise ConfigurationError(
                        f"{source} line {number}: expected NAME:ROLE:sha256:HEX with ROLE"
                        f" one of {', '.join(ROLES)} (make one: sasflow tokens new NAME)")
                users.append((Principal(found["name"], found["role"]),
                              bytes.fromhex(found["digest"])))
        names = [p.name for p, _ in users]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"{source}: a user is named twice")
        return cls(users)

    @classmethod
    def configured(cls, tokens_file: str | None) -> Users:
        """From `tokens_file`, else $SASFLOW_API_TOKENS; no users at all is an error:
        the server would refuse every caller."""
        if tokens_file:
            try:
                text = Path(tokens_file).read_text(encoding="utf-8")
            except OSError as error:
                raise ConfigurationError(
                    f"cannot read --tokens-file {tokens_file}: {error.strerror}") from None
            users = cls.parse(text, f"--tokens-file {tokens_file}")
        else:
            users = cls.parse(os.environ.get("SASFLOW_API_TOKENS", ""), "SASFLOW_API_TOKENS")
        if not users._users:
            raise ConfigurationError(
                "no API users: set SASFLOW_API_TOKENS or --tokens-file"
                " (make a token with: sasflow tokens new NAME --role operator)")
        return users

    def authenticate(self, token: str) -> Principal | None:
        """The user whose token this is, or None."""
        presented = _digest(token)
        found = None
        for principal, digest in self._users:  # every one, whatever matched
            if hmac.compare_digest(presented, digest):
                found = principal
        return found

    def named(self, name: str) -> Principal | None:
        return next((p for p, _ in self._users if p.name == name), None)


def new_token(name: str, role: str) -> tuple[str, str]:
    """A new token for `name`, and the configuration line that admits it."""
    if role not in ROLES:
        raise ConfigurationError(f"unknown role {role!r} (choose {', '.join(ROLES)})")
    if not re.fullmatch(_NAME, name):
        raise ConfigurationError(f"bad user name {name!r}: 1-64 of letters, digits, _ . @ -")
    token = "sf_" + secrets.token_urlsafe(32)
    return token, f"{name}:{role}:sha256:{_digest(token).hex()}"
