"""Fault matrix, version skew: a request or a reply from a newer release, carrying a field
this release does not know, is accepted as if the field were not there (SPEC R4, R6).

Every message the workers publish (`publish`, and a scheduler's `publish_soon`
where the transport has it), requests to agents and replies to schedulers, gets
an extra field on its way out, as a newer release would add one; over the
in-process transport, RabbitMQ and Redis (the machine's servers, private queue
names), every task still completes, each step once.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow import AgentRequest, App, Step
from sasflow.transport.base import agent_queue, reply_queue
from support.dist import private_transport

TASKS = 5
NEWER = {"added_in_a_newer_release": {"trace": [1, 2, 3], "hint": "ignore me"}}


@contextlib.contextmanager
def transport_url(kind: str, namespace: str) -> Iterator[str]:
    if kind == "memory":
        yield "memory"
    else:
        with private_transport(kind, namespace) as url:
            yield url


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["memory", "rabbitmq", "redis"])
def test_messages_with_an_unknown_field_from_a_newer_release_are_accepted(
        kind: str, tmp_path: Path) -> None:
    """Requests and replies with an extra field: every task processed, each step once."""
    namespace = uuid.uuid4().hex[:10]
    agent = f"echo-{namespace}"
    instance = f"skew-{namespace}"
    with transport_url(kind, namespace) as url:
        app = App(store=f"sqlite:///{tmp_path / 'store.db'}", transport=url)
        runs: list[tuple[str, str]] = []

        @app.agent(agent)
        def echo(req: AgentRequest) -> dict[str, Any]:
            runs.append((req.task_id, req.step))
            return {"n": req.input["n"], "step": req.step}

        app.workflow("skew", [Step("one", agent, 30.0), Step("two", agent, 30.0)])
        transport = app._transport
        publish = transport.publish
        publish_soon = getattr(transport, "publish_soon", None)  # a scheduler's requests
        extended: list[str] = []

        def newer(queue: str, body: bytes) -> bytes:
            message = json.loads(body)
            if queue in (agent_queue(agent), reply_queue(instance)):
                message.update(NEWER)
                extended.append(queue)
            return json.dumps(message).encode()

        async def as_a_newer_release(queue: str, body: bytes) -> None:
            await publish(queue, newer(queue, body))

        transport.publish = as_a_newer_release  # type: ignore[method-assign]
        if publish_soon is not None:  # RabbitMQ's; the Transport protocol does not declare it
            transport.publish_soon = (  # type: ignore[attr-defined]
                lambda queue, body: publish_soon(queue, newer(queue, body)))
        app.start(instance_id=instance, supervisor_interval=0.25)
        try:
            ids = [app.submit("skew", {"n": n}) for n in range(TASKS)]
            tasks = [app.wait(task_id, timeout=60) for task_id in ids]
        finally:
            app.stop()
    assert [t.state.value for t in tasks] == ["processed"] * TASKS
    assert [t.steps[1].result for t in tasks] == [{"n": n, "step": "two"} for n in range(TASKS)]
    assert sorted(runs) == sorted((t, s) for t in ids for s in ("one", "two")), "a step ran twice"
    assert set(extended) == {agent_queue(agent), reply_queue(instance)}, extended
    assert len(extended) == 4 * TASKS  # two requests and two replies per task
