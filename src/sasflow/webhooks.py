"""Alert webhooks: which URLs, what each POST carries, and how it is signed (SPEC E8).

Every alert is POSTed as JSON (`alert_body`) to every configured URL by the
supervisors' leader (alert_delivery.py), with two headers:

* ``X-Sasflow-Alert-Id``: the alert's id. Delivery is at least once: a deliverer
  that dies between a POST and recording it sends that POST again, once, so a
  receiver dedupes by this id.
* ``X-Sasflow-Signature: t=UNIX_SECONDS,v1=HEX``: HEX is the HMAC-SHA256, under
  the shared secret, of the timestamp, a dot and the raw body
  (``f"{t}.".encode() + body``), as Stripe signs its webhooks. The timestamp lets
  a receiver refuse a request replayed later; `verify_signature` checks both.

A URL is shown (in logs, errors and the store's delivery rows) only as `redact`
shows it: its password and secret query values masked. A token a receiver
carries in its path is not masked: put it in the query or the userinfo instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from sasflow.errors import ConfigurationError
from sasflow.model import isoformat
from sasflow.redact import redact
from sasflow.store.records import Alert

__all__ = ["ALERT_ID_HEADER", "SECRET_VARIABLE", "SIGNATURE_HEADER", "URLS_VARIABLE",
           "Webhooks", "alert_body", "configured_webhooks", "from_environment", "sign",
           "verify_signature"]

ALERT_ID_HEADER = "X-Sasflow-Alert-Id"
SIGNATURE_HEADER = "X-Sasflow-Signature"
URLS_VARIABLE = "SASFLOW_ALERT_WEBHOOKS"  # comma-separated
SECRET_VARIABLE = "SASFLOW_ALERT_WEBHOOK_SECRET"
DEFAULT_TOLERANCE_S = 300.0  # how old a signature a receiver accepts, by default


@dataclass(frozen=True, slots=True)
class Webhooks:
    """Checked webhook URLs (`configured_webhooks`) and the secret their POSTs are
    signed with (never shown: not in the repr)."""

    urls: tuple[str, ...]
    secret: str = field(repr=False)

    @property
    def by_label(self) -> dict[str, str]:
        """Each URL by its label: the URL as `redact` shows it, which is how the store
        keeps its deliveries, so no credential of it is ever written there."""
        return {redact(url): url for url in self.urls}


def configured_webhooks(urls: Iterable[str] | None, secret: str | None) -> Webhooks | None:
    """The webhooks `urls` name, signed with `secret`; None without any URL.

    ConfigurationError, in one line that shows neither the secret nor a URL's
    credentials, for a URL that is not http(s) with a host, or no secret.
    """
    if isinstance(urls, str):  # one URL would be read as its characters
        raise ConfigurationError("alert webhooks are a list of URLs, not one string")
    given = list(dict.fromkeys(u.strip() for u in urls or () if u.strip()))
    if not given:
        return None
    labels: dict[str, str] = {}
    for url in given:
        _check_url(url)
        label = redact(url)
        if label in labels:  # deliveries are kept by label: two must not share one
            raise ConfigurationError(f"alert webhooks {label!r} differ only in their"
                                     " credentials: give one of them")
        labels[label] = url
    if not secret:
        raise ConfigurationError(f"alert webhooks need a secret to sign with: set"
                                 f" {SECRET_VARIABLE} (or --alert-webhook-secret)")
    return Webhooks(tuple(given), secret)


def _check_url(url: str) -> None:
    problem = None
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises ValueError
    except ValueError as error:
        problem = str(error)
    else:
        if parts.scheme not in ("http", "https"):
            problem = "not an http:// or https:// URL"
        elif not parts.hostname:
            problem = "no host"
    if problem is None and any(c.isspace() for c in url):
        problem = "it holds blanks"
    if problem is not None:
        raise ConfigurationError(f"bad alert webhook URL {redact(url)!r}: {problem}")


def from_environment(environ: Mapping[str, str] = os.environ
                     ) -> tuple[list[str], str | None]:
    """The webhook URLs ($SASFLOW_ALERT_WEBHOOKS, comma-separated) and secret
    ($SASFLOW_ALERT_WEBHOOK_SECRET) of the environment."""
    urls = [u.strip() for u in environ.get(URLS_VARIABLE, "").split(",") if u.strip()]
    return urls, environ.get(SECRET_VARIABLE) or None


def alert_body(alert: Alert) -> bytes:
    """The JSON an alert is POSTed as: its fields, times as ISO-8601 in UTC."""
    return msgspec.json.encode({
        "id": alert.id, "task_id": alert.task_id, "step": alert.step, "agent": alert.agent,
        "at": isoformat(alert.at), "message": alert.message, "incident": alert.incident,
        "count": alert.count, "resolved_at": isoformat(alert.resolved_at)})


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The X-Sasflow-Signature of `body` sent at `timestamp` (seconds since the epoch)."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify_signature(secret: str, header: str, body: bytes | str,
                     tolerance_s: float = DEFAULT_TOLERANCE_S, *,
                     now: float | None = None) -> bool:
    """Whether `header` (a request's X-Sasflow-Signature) signs `body` (its raw body, as
    received: not parsed and encoded again) with `secret`, at a time within
    `tolerance_s` seconds of `now` (default: this host's clock).

    False for a malformed header, a stale or future timestamp, or no matching ``v1``
    (several are accepted: any one may match). Compared in constant time.
    """
    if isinstance(body, str):
        body = body.encode()
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, equals, value = item.strip().partition("=")
        if key == "t" and equals and value.isascii() and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and equals and value.isascii():
            signatures.append(value)
    if timestamp is None or not signatures:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = _digest(secret, timestamp, body).encode()
    return any(hmac.compare_digest(expected, s.encode()) for s in signatures)
