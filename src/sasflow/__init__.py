"""sasflow: durable, self-healing multi-step tasks (the Scheduler-Agent-Supervisor pattern)."""

import logging

from sasflow.agent import AgentRequest
from sasflow.app import App
from sasflow.errors import (
    ConfigurationError,
    InputError,
    InvalidTransitionError,
    MessageRefused,
    PayloadError,
    PermanentError,
    SasflowError,
    StoreError,
    TaskConflictError,
    TransportError,
    UnknownAlertError,
    UnknownTaskError,
    UnknownWorkflowError,
    WaitTimeout,
)
from sasflow.messages import Status, StatusEvent
from sasflow.model import StepState, Task, TaskState
from sasflow.workflow import Step

__all__ = [
    "AgentRequest",
    "App",
    "ConfigurationError",
    "InputError",
    "InvalidTransitionError",
    "MessageRefused",
    "PayloadError",
    "PermanentError",
    "SasflowError",
    "Status",
    "StatusEvent",
    "Step",
    "StepState",
    "StoreError",
    "Task",
    "TaskConflictError",
    "TaskState",
    "TransportError",
    "UnknownAlertError",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "WaitTimeout",
]

# A library's logs are the application's to show: without a handler of its own
# configured, sasflow's warnings (a store down and retried) print nothing, instead
# of reaching stderr through logging's last resort (a one-line command's answer is
# its one line). `sasflow worker` configures logging and shows them.
logging.getLogger("sasflow").addHandler(logging.NullHandler())
