"""The API fuzzed from its own OpenAPI document (SPEC U4, U7): whatever schemathesis
generates from it, sent by a viewer and by an operator to the API over a running
shop, no request gets a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from webshop import make_shop

from sasflow.web.app import create_app
from support.web import AS_OPERATOR, AS_VIEWER, USERS, serving

# schemathesis gives every case of an operation one node id: pytest-xdist, which
# tells tests apart by their ids, would run one case of each
pytestmark = pytest.mark.serial

# the document alone, from an app that never opens its store
schema = schemathesis.openapi.from_dict(create_app(make_shop("memory://"), USERS).openapi())
_FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    """The API over a running shop on SQLite, on a real loopback port; its URL."""
    shop = make_shop(f"sqlite:///{tmp_path / 'fuzz.db'}")
    shop.start(concurrency=8)
    with serving(create_app(shop, USERS)) as url:
        yield url
    shop.stop()
    shop.close()


def _send(live: str, case: Any, headers: dict[str, str]) -> None:
    # the keyword arguments schemathesis makes are those of `requests`
    response = requests.request(**case.as_transport_kwargs(base_url=live, headers=headers),
                                timeout=60)
    assert response.status_code < 500, (case.as_curl_command(), response.text)
    if response.status_code >= 400:  # every refusal says why, as JSON
        assert response.json()["error"]["message"]


@schema.parametrize()
@_FUZZ
def test_no_request_of_a_viewer_gets_a_server_error(case: Any, live: str) -> None:
    _send(live, case, AS_VIEWER)


@schema.parametrize()
@_FUZZ
def test_no_request_of_an_operator_gets_a_server_error(case: Any, live: str) -> None:
    _send(live, case, AS_OPERATOR)
