"""A simulated remote service: deduplicates by idempotency key and keeps a ledger.

What a well-behaved remote does (S3): a request whose key it has answered
already gets the first answer again, never a second effect; a refusal is an
answer too, so a key refused once stays refused (a copy of the request that
arrives late must not apply what the task has moved past); an undo names the
effect it undoes, and an undo that arrives before its effect leaves a
tombstone, so the late effect is refused. Every attempt and every effect is
written in the ledger, which the invariants read after a run.

How it misbehaves is the fault hook's choice, per attempt: fail at once
(transient), refuse for good (permanent), apply the effect and lose the reply,
or hang past the caller's deadline (and, sometimes, apply the effect later
anyway, as a server that got the request does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sasflow.agent import AgentRequest
from sasflow.errors import PermanentError
from sasflow.model import Phase, idempotency_key
from sasflow.testing.gate import current_gate

__all__ = ["Attempt", "Effect", "RemoteUnavailable", "SimRemote"]

# What an attempt may meet (the fault hook returns one of these)
OK, TRANSIENT, PERMANENT, LOST_REPLY, HANG, HANG_THEN_APPLY = (
    "ok", "transient", "permanent", "lost-reply", "hang", "hang-then-apply")


class RemoteUnavailable(Exception):
    """A transient failure of the simulated remote service."""


@dataclass(slots=True)
class Attempt:
    """One call that reached the service."""

    seq: int
    at: float
    instance: str | None
    agent: str
    task_id: str
    step: str
    phase: str
    key: str
    attempt: int  # the agent's attempt number within one dispatch
    outcome: str


@dataclass(slots=True)
class Effect:
    """A side effect the service applied (or an undo of one)."""

    seq: int
    at: float
    key: str  # the idempotency key it was applied under
    task_id: str
    step: str
    phase: str  # do | undo
    result: Any
    undoes: str | None = None  # an undo: the key of the effect it reverses
    applied: bool = True  # False: an undo that found nothing to reverse (a tombstone)


@dataclass
class SimRemote:
    """The remote service every agent of a simulation calls."""

    clock: Callable[[], float]
    fault: Callable[[str, str], str] | None = None  # (agent, phase) -> outcome
    hang_for: Callable[[], float] = lambda: 60.0
    attempts: list[Attempt] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    _by_key: dict[str, Effect] = field(default_factory=dict)
    _undone: dict[str, Effect] = field(default_factory=dict)  # do key -> its undo
    _refused: dict[str, str] = field(default_factory=dict)  # key -> the refusal
    _seq: int = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    async def call(self, agent: str, req: AgentRequest) -> Any:
        """Do (or undo, for a compensator's request) the request's work once per key."""
        gate = current_gate.get()
        if gate is not None:
            await gate.passage("remote.call")
        phase = Phase.UNDO.value if req.compensating else Phase.DO.value
        outcome = self.fault(agent, phase) if self.fault is not None else OK
        key = req.idempotency_key
        if key in self._refused:
            outcome = PERMANENT  # the first answer, again
        elif outcome == PERMANENT and key in self._by_key:
            outcome = OK  # it answers a request it has applied with the first answer
        self.attempts.append(Attempt(
            seq=self._next(), at=self.clock(), instance=None if gate is None else
            gate.instance_id, agent=agent, task_id=req.task_id, step=req.step, phase=phase,
            key=req.idempotency_key, attempt=req.attempt, outcome=outcome))
        if outcome == TRANSIENT:
            raise RemoteUnavailable(f"{agent} is unavailable")
        if outcome == PERMANENT:
            refusal = self._refused.setdefault(key, f"{agent} refused {req.task_id}/{req.step}")
            raise PermanentError(refusal)
        if outcome in (HANG, HANG_THEN_APPLY):
            delay = self.hang_for()
            if outcome == HANG_THEN_APPLY:  # the server got it: it applies, whoever waits
                asyncio.get_running_loop().call_later(delay, self._apply, agent, req, phase)
            await asyncio.sleep(delay)
            raise RemoteUnavailable(f"{agent} answered too late")
        result = self._apply(agent, req, phase)
        if gate is not None:
            await gate.passage("remote.call.answer")
        if outcome == LOST_REPLY:
            raise RemoteUnavailable(f"{agent}: the reply was lost")
        if isinstance(result, PermanentError):
            raise result
        return result

    def _apply(self, agent: str, req: AgentRequest, phase: str) -> Any:
        key = req.idempotency_key
        known = self._by_key.get(key)
        if known is not None:
            return known.result
        if key in self._refused:  # a late copy of a request it has refused since
            return PermanentError(self._refused[key])
        if phase == Phase.DO.value:
            if key in self._undone:  # undone before it arrived: refused for good
                return PermanentError(f"{agent}: {req.task_id}/{req.step} was cancelled")
            effect = Effect(seq=self._next(), at=self.clock(), key=key, task_id=req.task_id,
                            step=req.step, phase=phase,
                            result={"by": agent, "ref": f"{req.task_id}/{req.step}"})
        else:
            target = idempotency_key(req.task_id, req.step)
            effect = Effect(seq=self._next(), at=self.clock(), key=key, task_id=req.task_id,
                            step=req.step, phase=phase, result={"undone": target},
                            undoes=target, applied=target in self._by_key)
            self._undone[target] = effect
        self._by_key[key] = effect
        self.effects.append(effect)
        return effect.result

    def effect(self, key: str) -> Effect | None:
        """The effect applied under `key`, if any."""
        return self._by_key.get(key)

    def undo_of(self, do_key: str) -> Effect | None:
        """The undo that reversed (or tombstoned) the effect of `do_key`, if any."""
        return self._undone.get(do_key)
