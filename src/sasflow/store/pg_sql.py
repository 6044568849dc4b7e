"""The PostgreSQL store's SQL: sql.py's statements in PostgreSQL's words.

The differences from sql.py are the dialect only: `%s` parameters with explicit
types where a NULL parameter would leave PostgreSQL guessing, `IS NOT DISTINCT
FROM` for SQLite's `IS`, `GREATEST` for the scalar `MAX`, `= ANY(%s)` for lists,
and `FOR UPDATE SKIP LOCKED` where SQLite relies on its one writer.
Column order of a task row is sql.TASK_COLUMNS everywhere.
"""

from __future__ import annotations

from sasflow.store.sql import TASK_COLUMNS

INSERT_TASK = """
INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to, created_at,
                   updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (task_id) DO NOTHING
RETURNING 1
"""

SELECT_TASK_IDENTITY = "SELECT workflow, input FROM tasks WHERE task_id = %s"

INSERT_STEP = """
INSERT INTO steps (task_id, phase, idx, name, agent, state, idempotency_key, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""

INSERT_HISTORY = """
INSERT INTO history (task_id, step, phase, at, actor, epoch, from_state, to_state, why)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

# The fence (DESIGN invariant 2/4): same epoch, state and owner as when read, and
# (supervisor) a complete-by that has passed. Zero rows changed = not applied.
# Under READ COMMITTED a racing writer waits for the row and then re-checks this
# WHERE against the committed row, so only one of two racing writers matches.
APPLY_TRANSITION = """
UPDATE tasks SET state = %s, phase = %s, cursor = %s, locked_by = %s,
                 complete_by = %s::double precision,
                 available_at = COALESCE(%s::double precision, available_at),
                 failure_count = %s, error = %s, epoch = epoch + %s, updated_at = %s
WHERE task_id = %s AND epoch = %s AND state = %s AND locked_by IS NOT DISTINCT FROM %s::text
  AND (%s::double precision IS NULL OR complete_by < %s::double precision)
RETURNING epoch
"""

# failure_count < 0 in the new values means "reset to 0" (operator retry).
UPSERT_STEP = """
INSERT INTO steps (task_id, phase, idx, name, agent, state, attempts, failure_count,
                   complete_by, idempotency_key, result, error, in_doubt, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, GREATEST(%s, 0), %s::double precision, %s, %s::text,
        %s::text, %s, %s)
ON CONFLICT (task_id, phase, idx) DO UPDATE SET
    state = excluded.state,
    attempts = steps.attempts + excluded.attempts,
    failure_count = CASE WHEN %s < 0 THEN 0
                         ELSE steps.failure_count + excluded.failure_count END,
    complete_by = COALESCE(excluded.complete_by, steps.complete_by),
    result = COALESCE(excluded.result, steps.result),
    error = excluded.error,
    in_doubt = GREATEST(steps.in_doubt, excluded.in_doubt),
    updated_at = excluded.updated_at
"""

MIRROR_UNDO = """
UPDATE steps SET state = %s, updated_at = %s WHERE task_id = %s AND phase = 'do' AND idx = %s
"""

INSERT_OUTBOX = "INSERT INTO outbox (queue, body, created_at) VALUES (%s, %s, %s)"
DELETE_OUTBOX = "DELETE FROM outbox WHERE id = ANY(%s)"

INSERT_ALERT = """
INSERT INTO alerts (task_id, step, agent, at, message) VALUES (%s, %s, %s, %s, %s)
"""

SELECT_TASK = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = %s"

# Served by the partial index tasks_locked: cost grows with what has expired.
SELECT_EXPIRED = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by < %s
ORDER BY complete_by LIMIT %s
"""

NEXT_EXPIRY = "SELECT MIN(complete_by) FROM tasks WHERE locked_by IS NOT NULL"

LIST_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE (%s::text IS NULL OR state = %s::text) AND (%s::text IS NULL OR workflow = %s::text)
ORDER BY created_at, task_id LIMIT %s
"""

SELECT_HISTORY = """
SELECT step, phase, at, actor, epoch, from_state, to_state, why FROM history
WHERE task_id = %s ORDER BY id
"""

SELECT_ALERTS = """
SELECT id, task_id, step, agent, at, message FROM alerts WHERE id > %s ORDER BY id LIMIT %s
"""

# Take the lease if it is free, expired, or already ours; a new holder bumps the epoch.
ACQUIRE_LEASE = """
INSERT INTO leases (name, holder, epoch, expires_at) VALUES (%s, %s, 1, %s)
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch
                 ELSE leases.epoch + 1 END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
WHERE leases.holder = excluded.holder OR leases.expires_at < %s
RETURNING holder, epoch
"""

# One workflow at a time: an ordered range scan of the partial index tasks_claimable.
# SKIP LOCKED: rows another scheduler is claiming right now are passed over, not
# waited for, so concurrent claims take disjoint tasks without blocking (M1).
SELECT_CLAIMABLE = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE workflow = %s AND available_at <= %s
  AND locked_by IS NULL AND state IN ('pending', 'compensating')
ORDER BY available_at LIMIT %s
FOR UPDATE SKIP LOCKED
"""

SELECT_STEPS = """
SELECT task_id, phase, idx, name, agent, state, attempts, failure_count, complete_by,
       idempotency_key, result, error, in_doubt
FROM steps WHERE task_id = ANY(%s) ORDER BY task_id, phase, idx
"""

LEASE_OUTBOX = """
UPDATE outbox SET leased_until = %s
WHERE id IN (SELECT id FROM outbox
             WHERE leased_until < %s AND (%s::text[] IS NULL OR queue = ANY(%s::text[]))
             ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, queue, body
"""

DB_CLOCK = "SELECT extract(epoch FROM clock_timestamp())::double precision"

# Migrations: serialised across processes by a transaction-level advisory lock.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtext('sasflow.schema_migrations'))"
CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version text PRIMARY KEY, applied_at double precision NOT NULL)
"""
SELECT_MIGRATIONS = "SELECT version FROM schema_migrations"
INSERT_MIGRATION = "INSERT INTO schema_migrations VALUES (%s, %s)"
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
