"""Chaos scenarios: real worker processes killed with signals.

The harness (support/chaos.py) and the application the workers run
(support/apps/chaosapp.py) live in the support package; the test modules import both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.examples.orders.remote import RemoteService
from support.chaos import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    world = Cluster(tmp_path)
    try:
        yield world
    finally:
        world.close()


@pytest.fixture
def remote(cluster: Cluster) -> Iterator[RemoteService]:
    """The real flaky-service implementation on loopback (no faults: dedup is what is tested)."""
    with RemoteService() as service:
        cluster.remote_url = service.url
        yield service

