"""Chaos scenarios: real worker processes killed with signals.

The harness (apps/chaosharness.py) and the application the workers run
(apps/chaosapp.py) live beside the tests; the test modules import both.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "apps"))

from chaosharness import Cluster

from sasflow.examples.orders.remote import RemoteService


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

