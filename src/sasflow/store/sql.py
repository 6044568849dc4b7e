"""The store's SQL, written once, with `?` parameters.

Column order of a task row everywhere: task_id, workflow, input, state, phase,
cursor, locked_by, complete_by, available_at, failure_count, epoch, reply_to,
error, created_at, updated_at, version.
"""

from __future__ import annotations

from collections.abc import Iterable

from sasflow.model import CLAIMABLE_TASK_STATES, UNFINISHED_TASK_STATES, TaskState


def _states(states: Iterable[TaskState]) -> str:
    return ", ".join(f"'{state.value}'" for state in states)


# model.claimable in SQL, word for word the WHERE of the partial index tasks_claimable
# (the migrations; tests/unit/test_model.py checks that they and model.py agree).
CLAIMABLE_SQL = f"locked_by IS NULL AND state IN ({_states(CLAIMABLE_TASK_STATES)})"
# model.UNFINISHED_TASK_STATES in SQL: the tasks some worker still has to run
UNFINISHED_SQL = f"state IN ({_states(UNFINISHED_TASK_STATES)})"

TASK_COLUMNS = (
    "task_id, workflow, input, state, phase, cursor, locked_by, complete_by, available_at, "
    "failure_count, epoch, reply_to, error, created_at, updated_at, version"
)

INSERT_TASK = """
INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to, created_at,
                   updated_at, version)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO NOTHING
"""

SELECT_TASK_IDENTITY = "SELECT workflow, input FROM tasks WHERE task_id = ?"

INSERT_STEP = """
INSERT INTO steps (task_id, phase, idx, name, agent, state, idempotency_key, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

INSERT_HISTORY = """
INSERT INTO history (task_id, step, phase, at, actor, epoch, from_state, to_state, why)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

# The fence: the task must still have the epoch, state, owner, unit (phase and
# cursor) and version it was read with, and (supervisor) a complete-by that has
# passed and the lease still held with the epoch it swept under. Zero rows changed =
# not applied. The new values are the transition's own (rows.set_values).
APPLY_TRANSITION = """
UPDATE tasks SET state = ?, phase = ?, cursor = ?, locked_by = ?, complete_by = ?,
                 available_at = ?, failure_count = ?, error = ?,
                 epoch = ?, updated_at = ?, version = ?
WHERE task_id = ? AND epoch = ? AND state = ? AND locked_by IS ? AND phase = ? AND cursor = ?
  AND version IS ?
  AND (? IS NULL OR complete_by < ?)
  AND (? IS NULL OR EXISTS (SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ?))
"""

# A unit's complete new row (rows.implied_rows), as the transition carries it.
UPSERT_STEP = """
INSERT INTO steps (task_id, phase, idx, name, agent, state, attempts, failure_count,
                   complete_by, idempotency_key, result, error, in_doubt, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id, phase, idx) DO UPDATE SET
    name = excluded.name, agent = excluded.agent, state = excluded.state,
    attempts = excluded.attempts, failure_count = excluded.failure_count,
    complete_by = excluded.complete_by, idempotency_key = excluded.idempotency_key,
    result = excluded.result, error = excluded.error, in_doubt = excluded.in_doubt,
    updated_at = excluded.updated_at
"""

DROP_STEPS = "DELETE FROM steps WHERE task_id = ? AND phase = 'do' AND idx >= ?"

INSERT_OUTBOX = "INSERT INTO outbox (queue, body, created_at) VALUES (?, ?, ?)"
DELETE_OUTBOX = "DELETE FROM outbox WHERE id = ?"

INSERT_ALERT = """
INSERT INTO alerts (task_id, step, agent, at, message) VALUES (?, ?, ?, ?, ?)
"""

SELECT_TASK = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ?"

# Served by the partial index tasks_locked: cost grows with what has expired.
SELECT_EXPIRED = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by < ?
ORDER BY complete_by LIMIT ?
"""

# The same for one workflow (the supervisor's, per workflow it knows, R4): an ordered
# range scan of the partial index tasks_expiring, so tasks of workflows nobody here
# declares cost nothing however many have expired.
SELECT_EXPIRED_OF = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE workflow = ? AND locked_by IS NOT NULL AND complete_by < ?
ORDER BY complete_by LIMIT ?
"""

NEXT_EXPIRY = "SELECT MIN(complete_by) FROM tasks WHERE locked_by IS NOT NULL"
NEXT_EXPIRY_OF = """
SELECT MIN(complete_by) FROM tasks WHERE workflow = ? AND locked_by IS NOT NULL
"""

LIST_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE (? IS NULL OR state = ?) AND (? IS NULL OR workflow = ?)
ORDER BY created_at, task_id LIMIT ?
"""

SELECT_HISTORY = """
SELECT step, phase, at, actor, epoch, from_state, to_state, why FROM history
WHERE task_id = ? ORDER BY id
"""

ALERT_COLUMNS = "id, task_id, step, agent, at, message, incident, count, resolved_at"
SELECT_ALERTS = f"SELECT {ALERT_COLUMNS} FROM alerts WHERE id > ? ORDER BY id LIMIT ?"

# ---------------------------------------------------------------- incidents (R4)
# What unfinished work needs: tasks by workflow and version (index tasks_state), and
# the agent of the unit each is at. Cost grows with the unfinished tasks, not the
# store; the supervisor takes this census seldom (Supervisor.census_interval): with
# 20,000 tasks queued it took 70 ms on SQLite and 120 ms on PostgreSQL here.
CENSUS_VERSIONS = f"""
SELECT workflow, version, COUNT(*) FROM tasks
WHERE {UNFINISHED_SQL}
GROUP BY workflow, version
"""

CENSUS_AGENTS = f"""
SELECT t.workflow, t.version, s.agent, COUNT(*) FROM tasks t
JOIN steps s ON s.task_id = t.task_id AND s.phase = 'do' AND s.idx = t.cursor
WHERE t.{UNFINISHED_SQL}
GROUP BY t.workflow, t.version, s.agent
"""

# (unordered: with ORDER BY id SQLite scans every alert rather than use alerts_open)
SELECT_OPEN_INCIDENTS = f"""
SELECT {ALERT_COLUMNS} FROM alerts WHERE incident IS NOT NULL AND resolved_at IS NULL
"""

RESOLVE_INCIDENT = """
UPDATE alerts SET resolved_at = :now WHERE incident = :incident AND resolved_at IS NULL
"""

INSERT_INCIDENT = """
INSERT INTO alerts (task_id, step, agent, at, message, incident, count)
VALUES (NULL, NULL, :agent, :now, :message, :incident, :count)
"""

# Tasks written before versions existed: each gets its version from its own steps.
SELECT_UNVERSIONED = """
SELECT t.task_id, t.workflow, s.name, s.agent FROM tasks t
JOIN steps s ON s.task_id = t.task_id AND s.phase = 'do'
WHERE t.version IS NULL ORDER BY t.task_id, s.idx
"""
SET_VERSION = "UPDATE tasks SET version = ? WHERE task_id = ?"

# Take the lease if it is free, expired, or already ours; a new holder bumps the epoch.
ACQUIRE_LEASE = """
INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?, ?, 1, ?)
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch
                 ELSE leases.epoch + 1 END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
WHERE leases.holder = excluded.holder OR leases.expires_at < ?
RETURNING holder, epoch
"""


# A worker instance's heartbeat: its row, renewed; started_at stays as written by the
# first beat of the process now using the id.
BEAT = """
INSERT INTO instances (instance_id, host, pid, roles, agents, workflows, lease, started_at,
                       beat_at)
VALUES (:instance_id, :host, :pid, :roles, :agents, :workflows, :lease, :now, :now)
ON CONFLICT (instance_id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, roles = excluded.roles,
    agents = excluded.agents, workflows = excluded.workflows, lease = excluded.lease,
    started_at = CASE WHEN :first THEN excluded.started_at ELSE instances.started_at END,
    beat_at = excluded.beat_at, stopped_at = NULL
"""

MARK_STOPPED = "UPDATE instances SET stopped_at = :now WHERE instance_id = :instance_id"

SELECT_INSTANCES = """
SELECT instance_id, host, pid, roles, agents, workflows, started_at, beat_at, stopped_at,
       lease
FROM instances WHERE :instance_id IS NULL OR instance_id = :instance_id
ORDER BY started_at, instance_id
"""

# Tasks still locked by an instance that is gone: stopped, or no beat within its
# lease (R2); or locked under its id by an earlier process, the task last written
# before the current process's first beat (the second of margin covers two
# measurements of the database's clock in one process). Read through the partial
# index tasks_locked: the cost grows with the locked tasks, not with the store.
SELECT_ORPHANED = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by IS NOT NULL
  AND EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = tasks.locked_by
              AND (i.stopped_at IS NOT NULL OR i.beat_at + i.lease < :now
                   OR tasks.updated_at < i.started_at - 1.0))
  AND (:workflows IS NULL OR workflow IN (SELECT value FROM json_each(:workflows)))
ORDER BY complete_by LIMIT :limit
"""


def _marks(n: int) -> str:
    return ", ".join("?" * n)


# Is anything of this workflow version claimable? One index probe of tasks_claimable
# per version a scheduler declares (OR-ed together, SQLite would walk tasks_state).
PROBE_CLAIMABLE = f"""
SELECT 1 FROM tasks
WHERE workflow = ? AND version = ? AND available_at <= ?
  AND {CLAIMABLE_SQL}
LIMIT 1
"""


# One workflow version at a time: an ordered range scan of the partial index
# tasks_claimable (with `workflow IN (...)` SQLite would sort every runnable task to
# find the first few). Only the version a scheduler declares: a task planned for
# another shape drains on the workers that still have it (R4, M4).
SELECT_CLAIMABLE = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE workflow = ? AND version = ? AND available_at <= ?
  AND {CLAIMABLE_SQL}
ORDER BY available_at LIMIT ?
"""


def select_steps(tasks: int) -> str:
    return f"""
SELECT task_id, phase, idx, name, agent, state, attempts, failure_count, complete_by,
       idempotency_key, result, error, in_doubt
FROM steps WHERE task_id IN ({_marks(tasks)}) ORDER BY task_id, phase, idx
"""


def lease_outbox(queues: int | None) -> str:
    where = "" if queues is None else f"AND queue IN ({_marks(queues)})"
    return f"""
UPDATE outbox SET leased_until = ?
WHERE id IN (SELECT id FROM outbox WHERE leased_until < ? {where} ORDER BY id LIMIT ?)
RETURNING id, queue, body
"""
