"""The store's SQL, written once, with `?` parameters.

Column order of a task row everywhere: task_id, workflow, input, state, phase,
cursor, locked_by, complete_by, available_at, failure_count, epoch, reply_to,
error, created_at, updated_at.
"""

from __future__ import annotations

TASK_COLUMNS = (
    "task_id, workflow, input, state, phase, cursor, locked_by, complete_by, available_at, "
    "failure_count, epoch, reply_to, error, created_at, updated_at"
)

INSERT_TASK = """
INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to, created_at,
                   updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
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

# The fence: the task must still have the epoch, state and owner it was read with,
# and (supervisor) a complete-by that has passed, or is still the one read, and the
# lease still held with the epoch it swept under. Zero rows changed = not applied.
APPLY_TRANSITION = """
UPDATE tasks SET state = ?, phase = ?, cursor = ?, locked_by = ?, complete_by = ?,
                 available_at = COALESCE(?, available_at), failure_count = ?, error = ?,
                 epoch = epoch + ?, updated_at = ?
WHERE task_id = ? AND epoch = ? AND state = ? AND locked_by IS ?
  AND (? IS NULL OR complete_by < ?)
  AND (? IS NULL OR EXISTS (SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ?))
  AND (? IS NULL OR complete_by = ?)
"""

# The last parameter < 0 means "reset the failure count to 0" (operator retry); it
# comes apart from the inserted value, which is clamped at 0.
UPSERT_STEP = """
INSERT INTO steps (task_id, phase, idx, name, agent, state, attempts, failure_count,
                   complete_by, idempotency_key, result, error, in_doubt, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, MAX(?, 0), ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id, phase, idx) DO UPDATE SET
    state = excluded.state,
    attempts = steps.attempts + excluded.attempts,
    failure_count = CASE WHEN ? < 0 THEN 0
                         ELSE steps.failure_count + excluded.failure_count END,
    complete_by = COALESCE(excluded.complete_by, steps.complete_by),
    result = COALESCE(excluded.result, steps.result),
    error = excluded.error,
    in_doubt = MAX(steps.in_doubt, excluded.in_doubt),
    updated_at = excluded.updated_at
"""

MIRROR_UNDO = """
UPDATE steps SET state = ?, updated_at = ? WHERE task_id = ? AND phase = 'do' AND idx = ?
"""

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

NEXT_EXPIRY = "SELECT MIN(complete_by) FROM tasks WHERE locked_by IS NOT NULL"

LIST_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE (? IS NULL OR state = ?) AND (? IS NULL OR workflow = ?)
ORDER BY created_at, task_id LIMIT ?
"""

SELECT_HISTORY = """
SELECT step, phase, at, actor, epoch, from_state, to_state, why FROM history
WHERE task_id = ? ORDER BY id
"""

SELECT_ALERTS = """
SELECT id, task_id, step, agent, at, message FROM alerts WHERE id > ? ORDER BY id LIMIT ?
"""

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
ORDER BY complete_by LIMIT :limit
"""


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def probe_claimable(workflows: int) -> str:
    return f"""
SELECT 1 FROM tasks
WHERE locked_by IS NULL AND state IN ('pending', 'compensating') AND available_at <= ?
  AND workflow IN ({_marks(workflows)})
LIMIT 1
"""


# One workflow at a time: an ordered range scan of the partial index tasks_claimable
# (with `workflow IN (...)` SQLite would sort every runnable task to find the first few).
SELECT_CLAIMABLE = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE workflow = ? AND available_at <= ?
  AND locked_by IS NULL AND state IN ('pending', 'compensating')
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
