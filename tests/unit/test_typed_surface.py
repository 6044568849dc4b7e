"""What a user's type checker sees: typed request fields and a status-event enum."""

from __future__ import annotations

import typing
from typing import Any

import msgspec

from sasflow import AgentRequest, StatusEvent
from sasflow.messages import Status, decode_status, encode

EXPECTED = {"task_id": str, "step": str, "idempotency_key": str, "compensating": bool,
            "results": dict[str, Any]}


def test_agent_request_fields_have_real_types() -> None:
    """Each request field is a typed property (not a lambda whose type is Any)."""
    for name, expected in EXPECTED.items():
        prop = getattr(AgentRequest, name)
        assert isinstance(prop, property), name
        assert typing.get_type_hints(prop.fget)["return"] == expected, name


def test_status_event_is_a_str_enum_on_the_wire() -> None:
    """A decoded status carries a StatusEvent that still equals its plain string,
    and encodes as that string."""
    body = encode(Status(task_id="t", event=StatusEvent.PROCESSED, state="processed", at=0.0))
    assert msgspec.json.decode(body)["event"] == "processed"
    status = decode_status(body)
    assert status.event is StatusEvent.PROCESSED
    plain: str = "processed"
    assert status.event == plain
    assert {e.value for e in StatusEvent} == {
        "received", "step_completed", "processed", "error", "compensating", "compensated",
        "cancelled"}
