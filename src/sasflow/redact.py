"""The one rule for showing a URL: no secret in it is ever printed or logged (SPEC R5).

A URL can carry a secret in two places, and every client library sasflow uses
accepts both: the userinfo (``postgresql://user:SECRET@host/db``) and the query
string (``?password=SECRET``, which libpq and redis-py read; ``?token=...``,
``?sslpassword=...``). `redact` masks both; everything else stays, so the
operator still sees which host, port, database and options were meant.

`redact_text` applies the rule to every URL inside a longer text (an error
message, a client library's log line), and `RedactingFilter` to every log
record a handler emits, so a library that logs its own connection URL (aio-pika's
reconnect warnings print the query string) cannot leak it either.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

__all__ = [
    "MASK",
    "RedactingFilter",
    "guard_loggers",
    "is_secret_parameter",
    "redact",
    "redact_text",
    "scrub",
]

MASK = "***"

# A query parameter is secret when its name contains one of these (case-insensitive):
# password, passwd, pass, pwd, sslpassword, secret, client_secret, token,
# access_token, auth, auth_token, credentials, api_key, apikey... Masking a
# harmless parameter costs nothing; printing a secret one cannot be undone.
_SECRET_NAME_PARTS = ("pass", "pwd", "secret", "token", "auth", "credential", "apikey",
                      "api_key", "api-key")

# scheme://rest, up to whitespace or a character that ends a URL in prose or repr()
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def is_secret_parameter(name: str) -> bool:
    """Whether a query parameter of this name carries a secret."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_NAME_PARTS)


def redact(url: str) -> str:
    """`url` with the password of its userinfo and every secret query value as ``***``.

    Never raises, whatever the text: a malformed URL is exactly the one an error
    message shows, so it is masked by its shape, not parsed.
    """
    return _split(url)[0]


def _split(url: str) -> tuple[str, list[str]]:
    """The redacted URL, and the secret values it held."""
    found: list[str] = []
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _redact_query(url, found), found
    # the userinfo ends at the last "@" before the query: a password may hold a raw "/"
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    later = rest.find("@", query_at)
    if later != -1 and "=" not in rest[query_at:later]:  # a raw "?" inside the password
        at = rest.rfind("@")
    userinfo, after = (rest[:at], rest[at + 1:]) if at != -1 else ("", rest)
    cut = min((i for i in (after.find(c) for c in "/?#") if i != -1), default=len(after))
    hostport, tail = after[:cut], after[cut:]
    if at != -1:
        user, colon, password = userinfo.partition(":")
        if colon:
            found.append(password)
        hostport = f"{user}:{MASK}@{hostport}" if colon else f"{userinfo}@{hostport}"
    return f"{scheme}://{hostport}{_redact_query(tail, found)}", found


def _redact_query(tail: str, found: list[str]) -> str:
    path, question, rest = tail.partition("?")
    if not question:
        return tail
    query, hash_, fragment = rest.partition("#")
    pieces = []
    for piece in query.split("&"):
        name, equals, value = piece.partition("=")
        if equals and is_secret_parameter(name):
            found.append(value)
            piece = f"{name}={MASK}"
        pieces.append(piece)
    return f"{path}?{'&'.join(pieces)}{hash_}{fragment}"


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted."""
    if "://" not in text:
        return text
    return _URL.sub(lambda match: redact(match.group(0)), text)


def scrub(text: str, url: str) -> str:
    """`text` (a client library's error about `url`) with every secret of `url` masked.

    Parsers quote fragments of the URL they reject ('unexpected spaces found in
    "SEC RET"'), so masking the URLs in the text is not enough: each secret value
    the URL holds is masked wherever it appears.
    """
    clean = redact_text(text)
    for secret in sorted(_secrets(url), key=len, reverse=True):
        clean = clean.replace(secret, MASK)
    return clean


def _secrets(url: str) -> set[str]:
    # percent-decoded too: a parser's message may quote either spelling; a secret of one
    # or two characters would mask every such letter of the message, and guards little
    return {v for value in _split(url)[1] for v in (value, unquote(value)) if len(v) >= 3}


class RedactingFilter(logging.Filter):
    """Redacts every URL in a record's message and traceback before a handler emits it.

    Attach it to a handler (the worker's stderr handler does), where it sees the
    records of every logger, the client libraries' included.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def guard_loggers(*packages: str) -> None:
    """Redact the records of these packages' loggers wherever they go.

    A filter on a logger sees only the records logged on that very logger, so it
    goes on each logger of the package that exists now (call this once the
    package is imported); the application's handlers then never see a secret,
    however the application set its logging up.
    """
    names = [name for name in list(logging.root.manager.loggerDict)
             if any(name == p or name.startswith(p + ".") for p in packages)]
    for name in {*packages, *names}:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())

