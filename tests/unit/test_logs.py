"""A process's log as text or JSON lines (U5): the fields, the context they come from,
one object a line, and no secret in either form (R5)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from sasflow.logs import JsonFormatter, configure_logging, log_context, log_handler, log_step

Log = tuple[logging.Logger, Callable[[], list[dict[str, Any]]]]


@pytest.fixture
def json_log() -> Iterator[Log]:
    """A logger writing through the json handler; the objects it wrote, one a line."""
    out = io.StringIO()
    logger = logging.getLogger("test.logs.json")
    handler = log_handler("json", out)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    def lines() -> list[dict[str, Any]]:
        text = out.getvalue()
        assert text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]

    try:
        yield logger, lines
    finally:
        logger.removeHandler(handler)


def test_a_record_without_context_has_the_four_base_fields(json_log: Log) -> None:
    logger, lines = json_log
    logger.info("claimed %d task(s)", 3)
    [line] = lines()
    assert line.keys() == {"ts", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == (
        "info", "test.logs.json", "claimed 3 task(s)")
    moment = datetime.fromisoformat(line["ts"])
    assert moment.utcoffset() == timedelta(0), line["ts"]  # UTC, and it says so


def test_a_record_in_a_context_carries_its_fields_until_the_context_ends(
        json_log: Log) -> None:
    logger, lines = json_log
    with log_context(instance="w-1"):
        with log_context(task_id="t-1", epoch=2):
            with log_context(step="charge"):
                logger.warning("inner")
            logger.warning("middle")
        logger.warning("outer")
    logger.warning("none")
    inner, middle, outer, none = lines()
    assert {k: inner[k] for k in ("task_id", "step", "epoch", "instance")} == {
        "task_id": "t-1", "step": "charge", "epoch": 2, "instance": "w-1"}
    assert (middle["task_id"], middle["epoch"], "step" in middle) == ("t-1", 2, False)
    assert outer["instance"] == "w-1" and "task_id" not in outer
    assert none.keys() == {"ts", "level", "logger", "message"}


def test_a_field_given_by_the_log_call_is_kept_over_the_context(json_log: Log) -> None:
    logger, lines = json_log
    with log_context(task_id="t-context"):
        logger.info("about another", extra={"task_id": "t-given"})
    assert lines()[0]["task_id"] == "t-given"


async def test_each_asyncio_task_logs_with_its_own_context(json_log: Log) -> None:
    """Two drivers taking turns on one loop: each line names its own task and step, and
    a driver's `log_step` stays inside it."""
    logger, lines = json_log

    async def drive(task_id: str) -> None:
        with log_context(task_id=task_id, epoch=1):
            for step in ("reserve", "charge"):
                log_step(step)
                logger.info("running")
                await asyncio.sleep(0)  # the other driver's turn

    await asyncio.gather(drive("a"), drive("b"))
    logger.info("after")
    assert [(line.get("task_id"), line.get("step")) for line in lines()] == [
        ("a", "reserve"), ("b", "reserve"), ("a", "charge"), ("b", "charge"), (None, None)]


def test_an_exception_is_one_string_field_on_the_same_line(json_log: Log) -> None:
    logger, lines = json_log
    try:
        raise ValueError("bad reply\nsecond line")
    except ValueError:
        logger.exception("step failed")
    [line] = lines()
    assert line["message"] == "step failed" and line["level"] == "error"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert line["exc"].endswith("ValueError: bad reply\nsecond line")


def test_one_object_per_line_even_for_multiline_messages(json_log: Log) -> None:
    logger, lines = json_log
    logger.info("first\nstill the first")
    logger.debug('quotes " and \\ and unicode é')
    logger.error("third")
    first, second, third = lines()
    assert first["message"] == "first\nstill the first"
    assert second["message"] == 'quotes " and \\ and unicode é'
    assert third["level"] == "error"


def test_a_url_secret_is_masked_in_the_message_and_the_traceback(json_log: Log) -> None:
    logger, lines = json_log
    try:
        raise ConnectionError("cannot reach postgresql://app:hunter22@db/tasks")
    except ConnectionError:
        logger.exception("store %s down", "redis://:hunter22@cache/0?password=hunter22")
    [line] = lines()
    assert "hunter22" not in json.dumps(line)
    assert line["message"] == "store redis://:***@cache/0?password=*** down"
    assert "postgresql://app:***@db/tasks" in line["exc"]


def test_text_keeps_its_format_and_masks_secrets_too() -> None:
    out = io.StringIO()
    logger = logging.getLogger("test.logs.text")
    handler = log_handler("text", out)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with log_context(task_id="t-1"):  # text shows no context: its lines stay as they were
            logger.warning("lost amqp://g:hunter22@mq/")
    finally:
        logger.removeHandler(handler)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING test\.logs\.text:"
                        r" lost amqp://g:\*\*\*@mq/\n", out.getvalue()), out.getvalue()


def test_configuring_again_replaces_the_handler_instead_of_adding_one() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    filters = {h: list(h.filters) for h in handlers}  # it adds the redaction to others'
    try:
        configure_logging("info", "text")
        configure_logging("warning", "json")
        added = [h for h in root.handlers if h not in handlers]
        assert len(added) == 1 and root.level == logging.WARNING
        assert isinstance(added[0].formatter, JsonFormatter)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
        for handler, kept in filters.items():
            handler.filters[:] = kept


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        log_handler("xml")


def test_a_context_sets_nothing_until_a_process_has_a_context_filter() -> None:
    """The fields' only reader is ContextFilter: until one exists, a driver's and each
    request's context set no variable (the roles' process runs some 15% fewer
    collections); from the first one on, contexts carry their fields."""
    script = """
import contextvars, io, json, logging, sys
from sasflow.logs import ContextFilter, JsonFormatter, log_context, log_step
def variables():
    return sorted(v.name for v in contextvars.copy_context() if v.name.startswith("sasflow_log"))
with log_context(task_id="t-1", epoch=1):
    log_step("charge")
    before = variables()
out = io.StringIO()
handler = logging.StreamHandler(out)
handler.addFilter(ContextFilter())
handler.setFormatter(JsonFormatter())
logger = logging.getLogger("fields")
logger.addHandler(handler)
with log_context(task_id="t-2", epoch=2):
    log_step("ship")
    after = variables()
    logger.warning("shipping")
line = json.loads(out.getvalue())
print(json.dumps([before, after, [line["task_id"], line["epoch"], line["step"]]]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    before, after, fields = json.loads(done.stdout)
    assert before == []
    assert after == ["sasflow_log_epoch", "sasflow_log_step", "sasflow_log_task_id"]
    assert fields == ["t-2", 2, "ship"]
