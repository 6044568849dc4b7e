"""The one redaction rule (R5): what it masks in a URL, and what it leaves alone."""

from __future__ import annotations

import logging

import pytest

from sasflow.redact import RedactingFilter, redact, redact_text, scrub


@pytest.mark.parametrize("url, shown", [
    ("postgresql://app:s3cret@db:5432/tasks", "postgresql://app:***@db:5432/tasks"),
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("amqp://app:s3/cr?et@mq:5672/vh", "amqp://app:***@mq:5672/vh"),  # raw / and ? inside
    ("amqp://app:a#b@mq/", "amqp://app:***@mq/"),
    ("postgresql://app@db/tasks?password=s3cret&sslmode=require",
     "postgresql://app@db/tasks?password=***&sslmode=require"),
    ("redis://cache/0?PASSWORD=s3cret", "redis://cache/0?PASSWORD=***"),
    ("postgresql://db/t?sslpassword=a&passwd=b&pwd=c&pass=d",
     "postgresql://db/t?sslpassword=***&passwd=***&pwd=***&pass=***"),
    ("https://api/x?access_token=a&auth=b&client_secret=c&api_key=d#frag",
     "https://api/x?access_token=***&auth=***&client_secret=***&api_key=***#frag"),
    ("postgresql://app:pw@db/t?password=pw2", "postgresql://app:***@db/t?password=***"),
])
def test_passwords_in_the_userinfo_and_the_query_are_masked(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize("url", [
    "sqlite:///var/lib/tasks.db?synchronous=full",
    "postgresql://app@db:5432/tasks?options=-csearch_path%3Dsasflow",
    "redis://cache:6379/0?client_name=worker@host&prefix=a:",
    "memory",
    "",
])
def test_a_url_without_a_secret_is_left_as_it_is(url: str) -> None:
    assert redact(url) == url


def test_every_url_in_a_text_is_masked() -> None:
    text = ('Connection attempt to "amqp://g:******@mq/?password=x1" failed;'
            " store postgresql://a:x2@db/t is down")
    assert redact_text(text) == ('Connection attempt to "amqp://g:***@mq/?password=***" failed;'
                                 " store postgresql://a:***@db/t is down")


def test_a_parser_message_quoting_a_fragment_of_the_url_is_scrubbed() -> None:
    """psycopg quotes the piece of the URL it rejects: the secret goes wherever it is."""
    url = "postgresql://app:sec ret@db/t"
    assert scrub('unexpected spaces found in "sec ret", use %20', url) == (
        'unexpected spaces found in "***", use %20')


def test_the_log_filter_masks_the_message_and_the_traceback() -> None:
    try:
        raise RuntimeError("cannot reach redis://:hunter22@cache/0")
    except RuntimeError as error:
        record = logging.LogRecord("aio_pika", logging.WARNING, __file__, 1,
                                   "lost %s", ("amqp://g:hunter22@mq/",), (
                                       type(error), error, error.__traceback__))
    assert RedactingFilter().filter(record)
    formatted = logging.Formatter().format(record)
    assert "hunter22" not in formatted
    assert "lost amqp://g:***@mq/" in formatted and "redis://:***@cache/0" in formatted
