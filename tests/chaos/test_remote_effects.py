"""An agent SIGKILLed after its remote effect, before its reply: another worker finishes
the task and the remote service applies the effect once (S3 stable idempotency key, M4)."""

from __future__ import annotations

import httpx
import pytest
from chaosapp import ORDER

from sasflow.examples.orders.remote import RemoteService
from support.chaos import Cluster
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos

ORDERS = 4


def test_effect_applied_before_a_sigkill_is_not_applied_again(
        cluster: Cluster, remote: RemoteService) -> None:
    """The victim charges each order and dies before replying; the survivor repeats the
    charge with the same key, the service deduplicates it, and each order ends processed
    with reserve, charge and ship applied exactly once each."""
    tasks = {f"o{n}": {"order_id": n} for n in range(1, ORDERS + 1)}
    cluster.submit(ORDER, tasks)
    victim = cluster.spawn("victim", hang_at=["do:charge"])
    cluster.wait_for("the victim to charge every order and stall before replying",
                     lambda: len(hangs(cluster, victim.pid, "charge")) == ORDERS,
                     timeout=HANG_GUARD)
    killed_at = victim.kill()
    assert remote.stats()["effects_by_operation"]["charge"] == ORDERS
    survivor = cluster.spawn("survivor")
    cluster.wait_for("every order processed by the survivor",
                     lambda: cluster.all_in(["processed"], ORDERS),
                     timeout=HANG_GUARD)

    stats = remote.stats()
    assert stats["duplicate_effects"] == 0, stats
    assert stats["deduplicated"] >= ORDERS, "each charge must be repeated, and deduplicated"
    assert stats["effects_by_operation"] == {
        "reserve": ORDERS, "charge": ORDERS, "ship": ORDERS, "release": 0, "refund": 0}
    with httpx.Client(base_url=remote.url) as client:
        for task, payload in tasks.items():
            applied = client.get("/effects", params={"order_id": payload["order_id"]}).json()
            assert applied == ["reserve", "charge", "ship"], (task, applied)

    effects = cluster.effects()
    history = cluster.history()
    charges = cluster.results("charge")
    for task in tasks:
        # the completed reserve was not run again (M4); the charge was, by the survivor
        assert [e.pid for e in effects if (e.task, e.step, e.event) == (task, "reserve", "start")
                ] == [victim.pid]
        assert [e.pid for e in effects if (e.task, e.step, e.event) == (task, "charge", "end")
                ] == [survivor.pid]
        done = [h for h in history
                if (h.task_id, h.step, h.to_state) == (task, "charge", "completed")]
        assert [(h.actor, h.at > killed_at) for h in done] == [(survivor.name, True)]
        assert charges[task]["pid"] == survivor.pid
    # the survivor was answered from the idempotency store: one effect id per order
    assert len({r["effect_id"] for r in charges.values()}) == ORDERS


def hangs(cluster: Cluster, pid: int, step: str) -> set[str]:
    return {e.task for e in cluster.effects()
            if e.event == "hang" and e.pid == pid and e.step == step}
