"""A worker's settings are checked where they are made, before anything runs."""

from __future__ import annotations

import pytest

from sasflow import ConfigurationError
from sasflow.worker import WorkerSettings


@pytest.mark.parametrize("instance_id", ["", "-lead", "pod 1", "a/b", "x" * 101, "é"])
def test_an_instance_id_that_cannot_name_a_queue_is_refused(instance_id: str) -> None:
    with pytest.raises(ConfigurationError, match=r"instance id .* must be 1-100 characters"):
        WorkerSettings(instance_id=instance_id)


def test_instance_ids_of_hosts_pods_and_tests_are_accepted() -> None:
    for instance_id in ("web-7f9c-2", "host.example.org-812-a1b2c3", "pod_1:2@zone", "x" * 100):
        assert WorkerSettings(instance_id=instance_id).instance_id == instance_id
