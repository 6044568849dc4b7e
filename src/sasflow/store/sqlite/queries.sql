-- SQLite's own statements (queries.py). Lists travel as one JSON text parameter,
-- read with json_each; a claim relies on the one writer (BEGIN IMMEDIATE) where
-- PostgreSQL skips locked rows.

-- fragment: steps
-- (a task's steps are read by a statement of their own: select_steps)

-- name: select_expired_of
-- The supervisor's, for the workflows it knows (R4): per workflow an ordered range
-- scan of the partial index tasks_expiring, bounded by `now`, so tasks of workflows
-- nobody here declares cost nothing however many have expired.
SELECT {task_columns} FROM json_each(:workflows) AS w
JOIN tasks ON tasks.workflow = w.value
WHERE tasks.locked_by IS NOT NULL AND tasks.complete_by < :now
ORDER BY tasks.complete_by, tasks.task_id LIMIT :limit

-- name: next_expiry_of
-- one index lookup (MIN over tasks_expiring) per workflow
SELECT MIN(e.due) AS due FROM (
    SELECT (SELECT MIN(complete_by) FROM tasks
            WHERE workflow = w.value AND locked_by IS NOT NULL) AS due
    FROM json_each(:workflows) AS w) AS e

-- name: select_orphaned
-- Tasks still locked by an instance that is gone: stopped, or no beat within its
-- lease (R2); or locked under its id by an earlier process, the task last written
-- before the current process's first beat (the second of margin covers two
-- measurements of the database's clock in one process). Read through the partial
-- index tasks_locked: the cost grows with the locked tasks, not with the store.
SELECT {task_columns} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by IS NOT NULL
  AND EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = tasks.locked_by
              AND (i.stopped_at IS NOT NULL OR i.beat_at + i.lease < :now
                   OR tasks.updated_at < i.started_at - 1.0))
  AND (:workflows IS NULL OR workflow IN (SELECT value FROM json_each(:workflows)))
ORDER BY complete_by, task_id LIMIT :limit

-- name: select_steps
SELECT {step_columns} FROM steps
WHERE task_id IN (SELECT value FROM json_each(:task_ids)) ORDER BY task_id, phase, idx

-- name: select_steps_of
-- (one task's, the common case: no list to encode and unpack)
SELECT {step_columns} FROM steps WHERE task_id = :task_id ORDER BY phase, idx

-- name: probe_claimable
-- Is anything of this workflow version claimable? One index probe of tasks_claimable
-- per version a scheduler declares (OR-ed together, SQLite would walk tasks_state).
SELECT 1 FROM tasks
WHERE workflow = :workflow AND version = :version AND available_at <= :now
  AND {claimable}
LIMIT 1

-- name: select_claimable
-- One workflow version at a time: an ordered range scan of the partial index
-- tasks_claimable (with `workflow IN (...)` SQLite would sort every runnable task to
-- find the first few). Only the version a scheduler declares: a task planned for
-- another shape drains on the workers that still have it (R4, M4).
SELECT {task_columns} FROM tasks
WHERE workflow = :workflow AND version = :version AND available_at <= :now
  AND {claimable}
ORDER BY available_at LIMIT :limit

-- name: insert_task
INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to, created_at,
                   updated_at, version)
VALUES (:task_id, :workflow, :input, :state, :available_at, :reply_to, :created_at,
        :updated_at, :version)
ON CONFLICT (task_id) DO NOTHING

-- name: insert_claimed_task
-- A new task as the claim planned with its submission leaves it (rows.submission_rows)
INSERT INTO tasks (task_id, workflow, input, state, phase, cursor, locked_by, complete_by,
                   available_at, failure_count, epoch, reply_to, created_at, updated_at,
                   version)
VALUES (:task_id, :workflow, :input, :state, :phase, :cursor, :locked_by, :complete_by,
        :available_at, :failure_count, :epoch, :reply_to, :created_at, :updated_at,
        :version)
ON CONFLICT (task_id) DO NOTHING

-- name: apply_transition
-- The fence: the task must still have the epoch, state, owner, unit (phase and
-- cursor) and version it was read with, and (supervisor) a complete-by that has
-- passed and the lease still held with the epoch it swept under. Zero rows changed =
-- not applied. The new values are the transition's own (rows.task_values).
UPDATE tasks SET state = :state, phase = :phase, cursor = :cursor, locked_by = :locked_by,
                 complete_by = :complete_by, available_at = :available_at,
                 failure_count = :failure_count, error = :error, epoch = :new_epoch,
                 updated_at = :updated_at, version = :version, ended_at = :ended_at
WHERE task_id = :task_id AND epoch = :epoch AND state = :from_state AND locked_by IS :owner
  AND phase = :from_phase AND cursor = :from_cursor AND version IS :from_version
  AND (:expired_before IS NULL OR complete_by < :expired_before)
  AND (:lease IS NULL OR EXISTS (SELECT 1 FROM leases WHERE name = :lease
                                 AND holder = :lease_holder AND epoch = :lease_epoch))

-- name: insert_step
-- A new task's step, written with it (columns.NEW_STEP)
INSERT INTO steps ({new_step_columns}) VALUES ({new_step_values})

-- name: upsert_step
-- A unit's complete new row, as the transition carries it (rows.implied_rows).
INSERT INTO steps ({step_columns}) VALUES ({step_values})
ON CONFLICT (task_id, phase, idx) DO UPDATE SET {step_updates}

-- name: insert_history
INSERT INTO history ({history_columns}) VALUES ({history_values})

-- name: insert_outbox
INSERT INTO outbox (queue, body, created_at) VALUES (:queue, :body, :created_at)

-- name: insert_alert
INSERT INTO alerts ({alert_columns}) VALUES ({alert_values})

-- name: drop_steps
DELETE FROM steps WHERE task_id = :task_id AND phase = 'do' AND idx >= :idx

-- name: lease_outbox
UPDATE outbox SET leased_until = :until
WHERE id IN (SELECT id FROM outbox WHERE leased_until < :now
             AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
             ORDER BY id LIMIT :limit)
RETURNING id, queue, body

-- name: delete_outbox
DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(:ids))

-- name: settle_alerts
-- Alerts the deliverer needs nothing more of leave the partial index
-- alerts_undelivered for good: acknowledged, raised before `oldest`, or settled for
-- every webhook of `webhooks` (delivered, given up, or out of attempts with the last
-- one's lease passed).
UPDATE alerts SET delivery_done_at = :now
WHERE delivery_done_at IS NULL
  AND (acknowledged_at IS NOT NULL OR at < :oldest
       OR NOT EXISTS (SELECT 1 FROM json_each(:webhooks) w WHERE NOT EXISTS (
              SELECT 1 FROM alert_deliveries d WHERE d.alert_id = alerts.id AND d.url = w.value
                AND (d.delivered_at IS NOT NULL OR d.gave_up_at IS NOT NULL
                     OR (d.tries >= :max_tries AND d.due_at <= :now)))))

-- name: select_alerts_of
SELECT {alert_read} FROM alerts WHERE id IN (SELECT value FROM json_each(:ids))

-- name: schema_migrations_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'

-- name: create_migrations
CREATE TABLE IF NOT EXISTS schema_migrations (version TEXT PRIMARY KEY, applied_at REAL NOT NULL)
