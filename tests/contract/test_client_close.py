"""Closing a client that an application used from its own event loop (client.py
`close`, `aclose`), on every store.

The PostgreSQL store's connections live on the loop that first used them, and
are closed there: a blocking `close()` made on that very loop would wait on
itself for good. It is refused with an error that names the way out, and
changes nothing; `await aclose()` closes everything from the loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sasflow import AgentRequest, App, Step, TaskState
from support.backends import STORES


@pytest.fixture(params=sorted(STORES))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORES[request.param](tmp_path)


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[App]:
    made = App(store=store_url)

    @made.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, int]:
        return {"reserved": 1}

    made.workflow("order", steps=[Step("reserve", agent="inventory")])
    yield made
    await made.aclose()


async def test_aclose_closes_from_the_loop_and_the_client_opens_again(app: App) -> None:
    task_id = await app.asubmit("order", {"n": 1})  # the store opened from this loop
    # (the memory store's data lives while a store refers to it: this one, closed)
    closed = app._backends.opened_store
    await app.aclose()
    assert app._backends.opened_store is None  # closed and let go
    assert (await app.aget(task_id)).state is TaskState.PENDING  # opened again on use
    await app.aclose()
    assert (await app.aget(task_id)).state is TaskState.PENDING
    assert closed is not app._backends.opened_store


async def test_close_on_the_loop_the_connections_live_on_is_refused_or_closes(
        app: App, store_url: str) -> None:
    task_id = await app.asubmit("order", {"n": 2})
    store = app._backends.opened_store
    assert store is not None
    if store_url.startswith("postgresql"):  # its pool lives on this loop
        with pytest.raises(RuntimeError, match=r"await app\.aclose\(\)"):
            app.close()
        assert app._backends.opened_store is store  # nothing closed, nothing let go
    else:  # nothing of the store lives on this loop: the blocking close works here too
        app.close()
        assert app._backends.opened_store is None
    assert (await app.aget(task_id)).state is TaskState.PENDING
