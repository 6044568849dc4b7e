"""What travels over the transport: requests to agents, their replies, and the
status messages an application receives on its own queue (S4, E11).

JSON on the wire (msgspec), so any broker and any language can read it. Every
message has to fit in the transport's limit (`max_message_bytes`); requests
and replies are encoded with `encode_within`, so a payload that outgrew it is
refused where it is made, with its size and the limit, rather than by the
broker somewhere downstream (R3, U7).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import msgspec

from sasflow.errors import PayloadError
from sasflow.model import Phase

__all__ = [
    "Reply",
    "Request",
    "Status",
    "StatusEvent",
    "decode_reply",
    "decode_request",
    "encode",
    "encode_json_value",
    "encode_within",
    "refuse_non_finite",
]


# out of the garbage collector, as model.py's records (see there)
class Request(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """Scheduler -> agent: run one unit of work before `complete_by`."""

    task_id: str
    step: str
    phase: Phase
    agent: str
    epoch: int
    input: Any
    results: dict[str, Any]  # earlier steps' results, by step name
    idempotency_key: str
    complete_by: float  # absolute, seconds since the epoch (the store's clock)
    reply_to: str  # the scheduler instance's reply queue
    result: Any = None  # for a compensation: the result of the step it undoes
    # the W3C traceparent of the scheduler's span for this attempt (tracing.py); left out
    # of the JSON when None, and skipped by readers that predate it
    trace: str | None = None


class Reply(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """Agent -> scheduler: the unit finished, or failed for good."""

    task_id: str
    step: str
    phase: Phase
    epoch: int
    ok: bool
    result: Any = None
    error: str | None = None
    permanent: bool = False  # a nontransient fault (S6); else the agent gave up retrying

    @classmethod
    def refusal(cls, request: Request, error: str) -> Reply:
        """The permanent error reply for a request that could not be sent at all."""
        return cls(task_id=request.task_id, step=request.step, phase=request.phase,
                   epoch=request.epoch, ok=False, error=error, permanent=True)


class StatusEvent(StrEnum):
    """What a status message reports. A `str` enum: `status.event == "processed"`
    still holds, and the wire carries the plain string."""

    RECEIVED = "received"  # the task is stored: it will run
    STEP_COMPLETED = "step_completed"  # `step` finished; its result is stored
    PROCESSED = "processed"  # every step completed
    ERROR = "error"  # stopped for an operator (E8); `error` says why
    COMPENSATING = "compensating"  # undoing its completed steps, last first; `error` why
    COMPENSATED = "compensated"  # every completed step undone
    CANCELLED = "cancelled"  # stopped by an operator, nothing undone


class Status(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Progress of a task, sent to the queue the application named (E11)."""

    task_id: str
    event: StatusEvent
    state: str
    at: float
    step: str | None = None
    error: str | None = None


_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(Request)
_reply_decoder = msgspec.json.Decoder(Reply)
_status_decoder = msgspec.json.Decoder(Status)

encode = _encoder.encode
decode_request = _request_decoder.decode
decode_reply = _reply_decoder.decode
decode_status = _status_decoder.decode


def encode_within(message: Request | Reply, limit: int, *, what: str) -> bytes:
    """`message` as JSON, or PayloadError naming `what`, its size and `limit`.

    A request carries the task's input and every earlier step's result, a reply
    an agent's result: either can outgrow what the transport carries. The
    error's text is what the task's error and the operator's alert will say.
    """
    body = _encoder.encode(message)
    if len(body) > limit:
        raise PayloadError(f"{what} of {len(body)} bytes is over the message limit of"
                           f" {limit} bytes", task_id=message.task_id, step=message.step)
    return body


def encode_json_value(value: Any) -> bytes:
    """`value` as JSON, or TypeError if it has no faithful JSON form.

    msgspec writes NaN and infinities as null; a task's input or a step's result
    must come back as it went in, so those are refused. The check costs a second
    look only when the output holds a null at all.
    """
    try:
        body = _encoder.encode(value)
    except msgspec.EncodeError as error:
        raise TypeError(str(error)) from None
    if b"null" in body and value is not None:  # (None alone is the null it wrote)
        refuse_non_finite(value)
    return body


def refuse_non_finite(value: Any) -> None:
    """TypeError if `value` holds a NaN or an infinity (which JSON cannot carry)."""
    try:
        json.dumps(value, allow_nan=False, default=str)
    except ValueError:
        raise TypeError("NaN and infinity have no JSON form") from None
