"""The HTTP API's world: the shop on each store with its roles running in the
background, the API app over it, and two users (a viewer and an operator)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from webshop import make_shop

from sasflow import App
from sasflow.web.app import create_app
from support.backends import STORES
from support.web import USERS


@pytest.fixture(params=["sqlite", "postgres"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    """The shop on a fresh store, its scheduler, agents and supervisor running."""
    app = make_shop(STORES[request.param](tmp_path))
    app.start(concurrency=8)
    yield app
    app.stop()
    app.close()


@pytest.fixture
async def api(shop: App) -> AsyncIterator[httpx.AsyncClient]:
    """The API over the shop, called in-process (ASGI)."""
    web = create_app(shop, USERS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web),
                                 base_url="http://sasflow.test") as client:
        yield client
