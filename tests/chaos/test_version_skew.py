"""Version skew (R4, M4): real workers of two releases over one SQLite store.

Release 2 of the shipment application shrank its step list (shipping_r1.py ->
shipping_r2.py) while a task of release 1 was in flight. Release 2's workers never
claim that task; one alert names its workflow version while no live worker can run
it; a worker of release 1 finishes it, its first step not run again.

Tasks of a workflow that no worker declares (renamed away between releases) cost
the supervisor nothing: the known ones held by a dead worker are recovered as if
the others were not there, and the others raise one alert, not a line per task.
"""

from __future__ import annotations

from collections import Counter

import chaosapp
import pytest
import shipping_r1
import shipping_r2

from sasflow import App, Step
from sasflow.plan import Plan
from sasflow.workflow import workflow_version
from support.chaos import Cluster

pytestmark = pytest.mark.chaos

R1 = workflow_version("shipment", [("pick", "picker"), ("label", "labeller")])
HANG = 3600.0  # hang guards only: each wait ends on its own positive signal


def incident_alerts(cluster: Cluster, incident: str) -> list[tuple[int, int, float | None]]:
    """(id, count, resolved_at) of the alerts raised for `incident`."""
    return [(r[0], r[1], r[2]) for r in cluster.query(
        "SELECT id, count, resolved_at FROM alerts WHERE incident = ? ORDER BY id", (incident,))]


def test_a_shrunk_step_list_never_meets_a_task_in_flight_of_the_old_release(
        cluster: Cluster) -> None:
    """The issue's case: release 2 never claims the old task (no IndexError, no re-run),
    an alert names its version while nothing can run it, and a release-1 worker
    finishes it with its first step run once."""
    old_release = shipping_r1.build_app(cluster.store_url)
    new_release = shipping_r2.build_app(cluster.store_url)
    assert old_release.workflows["shipment"].version == R1
    old_release.submit("shipment", {"n": 1}, task_id="old")
    old = cluster.spawn("old-1", script="shipping_r1.py", hang_at=["do:label"])
    cluster.wait_for("the old task's label step to be in flight on release 1",
                     lambda: any(e.event == "hang" and e.task == "old"
                                 for e in cluster.effects()), timeout=60)
    old.kill()  # its label step dies with it: the task stays locked until it expires

    cluster.spawn("new-1", script="shipping_r2.py")
    cluster.wait_for("release 2's supervisor to release the expired old task",
                     lambda: cluster.tasks()["old"][:3] == ("pending", None, 1), timeout=60)
    # submitted after the old task became claimable, and younger: release 2's scheduler
    # finishing it proves it polled past the old one, which it must not take
    new_release.submit("shipment", {"n": 2}, task_id="new")
    cluster.wait_for("the new task processed by release 2",
                     lambda: cluster.tasks()["new"][0] == "processed", timeout=60)
    assert cluster.tasks()["old"][:2] == ("pending", None)
    claims = [h for h in cluster.history() if h.task_id == "old" and h.step is None
              and (h.from_state, h.to_state) == ("pending", "processing")]
    assert [h.actor for h in claims] == ["old-1"]

    incident = f"workflow:shipment@{R1}"
    [(_, count, resolved)] = cluster.wait_for(
        "one alert naming the old version", lambda: incident_alerts(cluster, incident),
        timeout=120)
    assert (count, resolved) == (1, None)

    cluster.spawn("old-2", script="shipping_r1.py")
    cluster.wait_for("the old task processed by release 1",
                     lambda: cluster.tasks()["old"][0] == "processed", timeout=60)
    cluster.wait_for("the alert resolved once the old task is done",
                     lambda: incident_alerts(cluster, incident)[-1][2] is not None,
                     timeout=120)
    assert len(incident_alerts(cluster, incident)) == 1

    done = cluster.completions()
    assert (done[("old", "pick", "do")], done[("old", "label", "do")]) == (1, 1)
    starts = Counter((e.task, e.step) for e in cluster.effects() if e.event == "start")
    assert starts[("old", "pick")] == 1  # the completed first step never ran again
    assert cluster.results("label")["old"]["pid"] == cluster.workers[-1].pid


def test_tasks_of_an_unknown_workflow_raise_one_alert_and_hold_up_no_recovery(
        cluster: Cluster) -> None:
    """1,100 expired tasks of a workflow renamed away and 50 known ones locked by a dead
    worker: the known ones all finish, one alert names the unknown workflow with its
    count, and the worker's log names it once."""
    renamed = App(store=cluster.store_url)
    for agent in ("quick", "slow"):
        renamed.agent(agent)(lambda req: None)
    gone = renamed.workflow("pipeline-v0", [Step("a", "quick", 0.1)])
    ids = [renamed.submit("pipeline-v0", {}, task_id=f"gone-{n:04}") for n in range(1100)]
    known = cluster.submit(chaosapp.PIPELINE, {f"k{n:02}": {} for n in range(50)})

    async def claim_as_a_dead_worker() -> None:
        store = renamed._store
        await store.claim("dead", len(ids), {"pipeline-v0": Plan(gone, frozenset())})
        plans = cluster.app._plans()
        await store.claim("dead", len(known), {chaosapp.PIPELINE: plans[chaosapp.PIPELINE]})

    renamed._loop.call(claim_as_a_dead_worker())
    assert cluster.states()["processing"] == 1150

    survivor = cluster.spawn("survivor")
    cluster.wait_for("the 50 known tasks processed",
                     lambda: cluster.states()["processed"] == 50, timeout=120)
    incident = f"workflow:pipeline-v0@{gone.version}"
    [(_, count, _)] = cluster.wait_for("the alert naming the unknown workflow",
                                       lambda: incident_alerts(cluster, incident), timeout=120)
    assert count == 1100
    # another unknown workflow's alert later: proof that further censuses ran since
    ghost = App(store=cluster.store_url)
    ghost.agent("quick")(lambda req: None)
    ghost.workflow("ghost", [Step("a", "quick")])
    ghost.submit("ghost", {})
    cluster.wait_for("a second incident's alert", lambda: incident_alerts(
        cluster, f"workflow:ghost@{ghost.workflows['ghost'].version}"), timeout=120)
    ghost.close()
    renamed.close()
    assert len(incident_alerts(cluster, incident)) == 1
    assert cluster.states()["processing"] == 1100  # left as they were, never swept
    log = survivor.log.read_text().splitlines()
    mentions = [line for line in log if "pipeline-v0" in line or "gone-" in line]
    assert len(mentions) == 1, mentions
    # recovered at their first expiry, in a sweep or two, never waiting behind the others
    recoveries = [line for line in log if "recovered" in line]
    assert 1 <= len(recoveries) <= 2, recoveries
    assert {state[2] for task, state in cluster.tasks().items() if task.startswith("k")} == {1}
