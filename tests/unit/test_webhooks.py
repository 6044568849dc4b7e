"""Alert webhooks (SPEC E8): the signature a receiver verifies, the body it parses, and
the configuration, refused in one line that shows no secret (webhooks.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sasflow import App, ConfigurationError
from sasflow.store.records import Alert
from sasflow.webhooks import (
    alert_body,
    configured_webhooks,
    from_environment,
    sign,
    verify_signature,
)
from sasflow.worker import WorkerSettings

SECRET = "whsec-0123456789abcdef"
NOW = 1_700_000_000
BODY = b'{"id":7,"message":"card declined"}'


def test_the_signature_is_an_hmac_of_the_timestamp_a_dot_and_the_body() -> None:
    """The scheme receivers implement without sasflow (docs/deploy.md)."""
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, BODY, NOW) == f"t={NOW},v1={expected}"


def test_a_signature_verifies_and_a_tampered_body_or_another_secret_fails() -> None:
    header = sign(SECRET, BODY, NOW)
    assert verify_signature(SECRET, header, BODY, now=NOW)
    assert verify_signature(SECRET, header, BODY.decode(), now=NOW + 299)  # text is encoded
    assert not verify_signature(SECRET, header, BODY.replace(b"7", b"8"), now=NOW)
    assert not verify_signature(SECRET + "x", header, BODY, now=NOW)


def test_a_signature_outside_the_tolerance_fails_either_way() -> None:
    header = sign(SECRET, BODY, NOW)
    assert not verify_signature(SECRET, header, BODY, now=NOW + 301)
    assert not verify_signature(SECRET, header, BODY, now=NOW - 301)
    assert verify_signature(SECRET, header, BODY, 600, now=NOW + 599)


@pytest.mark.parametrize("header", [
    "", "garbage", f"t={NOW}", "v1=abc", f"t=soon,v1={'0' * 64}", f"t=١٢,v1={'0' * 64}",
    f"t={NOW},v1=é", f"t={NOW},v1={'0' * 64}"])
def test_a_malformed_or_wrong_header_fails(header: str) -> None:
    assert not verify_signature(SECRET, header, BODY, now=NOW)


def test_any_of_several_signatures_may_match() -> None:
    good = sign(SECRET, BODY, NOW).split(",")[1]
    assert verify_signature(SECRET, f"t={NOW}, v1={'0' * 64}, {good}", BODY, now=NOW)


def test_the_body_holds_every_field_times_in_utc() -> None:
    alert = Alert(id=3, task_id=None, at=NOW + 0.25, message="2 task(s) wait",
                  agent="payments", incident="agent:payments", count=2,
                  resolved_at=NOW + 60.0, acknowledged_by="ann")
    assert json.loads(alert_body(alert)) == {
        "id": 3, "task_id": None, "step": None, "agent": "payments",
        "at": "2023-11-14T22:13:20.250000+00:00", "message": "2 task(s) wait",
        "incident": "agent:payments", "count": 2,
        "resolved_at": "2023-11-14T22:14:20+00:00"}


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://hooks.example.org/a", "not an http:// or https:// URL"),
    ("hooks.example.org/a", "not an http:// or https:// URL"),
    ("https:///path", "no host"),
    ("https://hooks.example.org:port/a", "Port could not be cast"),
    ("https://hooks.example.org/a b", "it holds blanks"),
])
def test_a_bad_url_is_one_line_naming_it(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        configured_webhooks([url], SECRET)
    assert str(refused.value).startswith(f"bad alert webhook URL {url!r}: ")
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_what_is_refused_shows_neither_the_secret_nor_a_urls_credentials() -> None:
    with pytest.raises(ConfigurationError) as refused:
        configured_webhooks(["ftp://ops:hunter22@hooks.example.org/a?token=t0k3n"], SECRET)
    assert "hunter22" not in str(refused.value) and "t0k3n" not in str(refused.value)
    assert "ops:***@hooks.example.org" in str(refused.value)
    with pytest.raises(ConfigurationError, match="need a secret") as refused:
        configured_webhooks(["https://ops:hunter22@hooks.example.org/a"], None)
    assert "hunter22" not in str(refused.value)
    with pytest.raises(ConfigurationError, match="differ only in their credentials"):
        configured_webhooks(["https://a:one@h.example/x", "https://a:two@h.example/x"], SECRET)
    with pytest.raises(ConfigurationError, match="a list of URLs"):
        configured_webhooks("https://h.example/x", SECRET)


def test_urls_are_kept_once_and_shown_by_their_redacted_label() -> None:
    webhooks = configured_webhooks(["https://a:pw@h.example/x", " https://h.example/y ",
                                    "https://a:pw@h.example/x", ""], SECRET)
    assert webhooks is not None
    assert webhooks.urls == ("https://a:pw@h.example/x", "https://h.example/y")
    assert webhooks.by_label == {"https://a:***@h.example/x": "https://a:pw@h.example/x",
                                 "https://h.example/y": "https://h.example/y"}
    assert SECRET not in repr(webhooks)
    assert configured_webhooks([], None) is None and configured_webhooks(None, SECRET) is None


def test_worker_settings_check_the_webhooks_and_never_show_the_secret() -> None:
    settings = WorkerSettings(alert_webhooks=["https://h.example/x"], alert_webhook_secret=SECRET)
    settings.check()
    assert SECRET not in repr(settings)
    with pytest.raises(ConfigurationError, match="need a secret"):
        WorkerSettings(alert_webhooks=["https://h.example/x"]).check()


def test_the_environment_gives_comma_separated_urls_and_the_secret() -> None:
    assert from_environment({"SASFLOW_ALERT_WEBHOOKS": " https://a.example/x,,https://b"
                                                       ".example/y, ",
                             "SASFLOW_ALERT_WEBHOOK_SECRET": SECRET}) == (
        ["https://a.example/x", "https://b.example/y"], SECRET)
    assert from_environment({}) == ([], None)


def test_an_apps_supervisor_delivers_to_the_webhooks_given_or_else_the_environments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Options win over the environment; an empty list turns delivery off; a worker
    without the supervisor role delivers nothing."""
    monkeypatch.setenv("SASFLOW_ALERT_WEBHOOKS", "https://env.example/hook")
    monkeypatch.setenv("SASFLOW_ALERT_WEBHOOK_SECRET", SECRET)
    app = App(store=f"sqlite:///{tmp_path / 'store.db'}")
    try:
        deliverer = app._worker(roles=["supervisor"]).alert_deliverer
        assert deliverer is not None
        assert deliverer.webhooks.urls == ("https://env.example/hook",)
        given = app._worker(alert_webhooks=["https://given.example/hook"]).alert_deliverer
        assert given is not None and given.webhooks.urls == ("https://given.example/hook",)
        assert app._worker(alert_webhooks=[]).alert_deliverer is None
        assert app._worker(roles=["scheduler", "agent"]).alert_deliverer is None
        monkeypatch.delenv("SASFLOW_ALERT_WEBHOOK_SECRET")
        with pytest.raises(ConfigurationError, match="need a secret"):
            app._worker()
    finally:
        app.close()


def test_only_a_process_that_posts_to_a_webhook_imports_the_http_client() -> None:
    """A worker, and every `sasflow` command, load the deliverer; the HTTP client it
    posts with (a third of the command line's start-up) comes in with the first POST."""
    script = ("import sys\n"
              "import sasflow, sasflow.cli, sasflow.worker, sasflow.alert_delivery\n"
              "print('httpx' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "False"
