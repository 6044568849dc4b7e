"""The errors sasflow raises, one tree with one root, grouped by who must act::

    SasflowError
    ├── ConfigurationError        the developer: a bad declaration, URL or APP reference
    │   └── MissingExtraError     an optional backend is not installed
    ├── InputError                the caller: bad input to submit / an operator command
    │   ├── UnknownWorkflowError
    │   ├── UnknownTaskError
    │   ├── UnknownAlertError
    │   ├── PayloadError          not JSON-serialisable, or over the size limit
    │   ├── TaskConflictError     same task id submitted with a different workflow/input
    │   └── InvalidTransitionError  an operator action the task's state does not allow
    ├── StoreError                the operator: the state store is unreachable or corrupt
    ├── TransportError            the operator: the message transport failed
    │   └── MessageRefused        ... or refuses this one message for good (a dead letter)
    ├── WaitTimeout               `wait` gave up before the task ended
    └── PermanentError            raised BY AGENT CODE: a nontransient fault, no retry (S6)

Errors carry the task id, step and agent where one applies, and are chained with
``raise ... from`` so the cause is never lost.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "InputError",
    "InvalidTransitionError",
    "MessageRefused",
    "MissingExtraError",
    "PayloadError",
    "PermanentError",
    "SasflowError",
    "StoreError",
    "TaskConflictError",
    "TransportError",
    "UnknownAlertError",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "WaitTimeout",
]


class SasflowError(Exception):
    """Root of every error sasflow raises."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        step: str | None = None,
        agent: str | None = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.step = step
        self.agent = agent


class ConfigurationError(SasflowError):
    """A declaration, URL or application reference is wrong."""


class MissingExtraError(ConfigurationError):
    """An optional backend's dependencies are not installed."""


class InputError(SasflowError):
    """Input from a caller or operator was refused; nothing was written."""


class UnknownWorkflowError(InputError):
    pass


class UnknownTaskError(InputError):
    pass


class UnknownAlertError(InputError):
    pass


class PayloadError(InputError):
    pass


class TaskConflictError(InputError):
    pass


class InvalidTransitionError(InputError):
    pass


class StoreError(SasflowError):
    """The state store could not be reached or answered unexpectedly."""


class TransportError(SasflowError):
    """The message transport could not deliver."""


class MessageRefused(TransportError):
    """The transport refuses this message for good: a queue name its broker cannot
    have, a body over its limit. Sending it again cannot help, unlike a broker
    that is down; whoever holds it gives it up (to the dead letters) and goes on."""


class WaitTimeout(SasflowError, TimeoutError):
    """A wait ended before the task reached a terminal state."""


class PermanentError(SasflowError):
    """Raise in an agent for a nontransient fault (card declined, a 4xx): no retry.

    The agent sends an error reply at once; the workflow's ``on_failure`` policy
    decides between an operator alert and compensation (S6).
    """
