"""sasflow: durable, self-healing multi-step tasks (the Scheduler-Agent-Supervisor pattern)."""

from sasflow.agent import AgentRequest
from sasflow.app import App
from sasflow.errors import (
    ConfigurationError,
    InputError,
    InvalidTransitionError,
    PayloadError,
    PermanentError,
    SasflowError,
    StoreError,
    TaskConflictError,
    TransportError,
    UnknownTaskError,
    UnknownWorkflowError,
    WaitTimeout,
)
from sasflow.model import StepState, Task, TaskState
from sasflow.workflow import Step

__all__ = [
    "AgentRequest",
    "App",
    "ConfigurationError",
    "InputError",
    "InvalidTransitionError",
    "PayloadError",
    "PermanentError",
    "SasflowError",
    "Step",
    "StepState",
    "StoreError",
    "Task",
    "TaskConflictError",
    "TaskState",
    "TransportError",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "WaitTimeout",
]
