-- The statements SQLite and PostgreSQL say alike (queries.py). A dialect's own
-- queries.sql replaces any of them whose spelling differs there.

-- name: select_task_identity
SELECT workflow, input FROM tasks WHERE task_id = :task_id

-- name: select_task
-- ({steps}: a dialect that reads a task's steps with it adds them as a column)
SELECT {task_columns}{steps} FROM tasks WHERE task_id = :task_id

-- name: select_expired
-- Across all workflows (the supervisor asks by workflow: select_expired_of). Served
-- on SQLite by the partial index tasks_locked, so the cost grows with what has
-- expired; on PostgreSQL, which keeps only tasks_expiring (its 0010), by a read of
-- that index's entries, one per task in flight.
SELECT {task_columns}{steps} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by < :now
ORDER BY complete_by, task_id LIMIT :limit

-- name: select_instances
SELECT instance_id, host, pid, CAST(roles AS TEXT) AS roles, CAST(agents AS TEXT) AS agents,
       CAST(workflows AS TEXT) AS workflows, started_at, beat_at, stopped_at, lease
FROM instances
WHERE CAST(:instance_id AS TEXT) IS NULL OR instance_id = CAST(:instance_id AS TEXT)
ORDER BY started_at, instance_id

-- name: next_expiry
-- MIN over the partial index tasks_locked: one index lookup on SQLite; on PostgreSQL
-- as select_expired
SELECT MIN(complete_by) AS due FROM tasks WHERE locked_by IS NOT NULL

-- name: select_history
SELECT step, phase, at, actor, epoch, from_state, to_state, why FROM history_entries
WHERE task_id = :task_id ORDER BY id, part

-- fragment: alert_read
-- an alert's row as alert_from_row reads it (rows.py)
id, task_id, step, agent, at, message, incident, count, resolved_at, acknowledged_at,
acknowledged_by, acknowledged_why

-- name: select_alerts
SELECT {alert_read} FROM alerts WHERE id > :after ORDER BY id LIMIT :limit

-- name: select_alert
SELECT {alert_read} FROM alerts WHERE id = :id

-- name: acknowledge_alert
-- the first acknowledgement stands: acknowledging again changes nothing
UPDATE alerts SET acknowledged_at = :now, acknowledged_by = :by, acknowledged_why = :why
WHERE id = :id AND acknowledged_at IS NULL

-- fragment: delivery_read
-- a delivery's row as DeliveryRecord reads it (records.py)
alert_id, url, tries, due_at, delivered_at, gave_up_at, last_error

-- name: take_alert_delivery
-- The next POSTs to one webhook (alert_delivery.py): alerts still pending (the partial
-- index alerts_undelivered, so the cost grows with those, not with every alert), not
-- acknowledged nor too old, that this webhook was neither sent nor refused, whose
-- last attempt's lease or backoff has passed; oldest first. Each attempt is counted
-- and leased until `until`; its count fences what it records. (The SELECT keeps its
-- WHERE: SQLite needs one before an upsert's ON CONFLICT.)
INSERT INTO alert_deliveries (alert_id, url, tries, due_at)
SELECT a.id, CAST(:url AS TEXT), 1, :until FROM alerts a
WHERE a.delivery_done_at IS NULL AND a.acknowledged_at IS NULL AND a.at >= :oldest
  AND NOT EXISTS (SELECT 1 FROM alert_deliveries d
                  WHERE d.alert_id = a.id AND d.url = CAST(:url AS TEXT)
                    AND (d.due_at > :now OR d.tries >= :max_tries
                         OR d.delivered_at IS NOT NULL OR d.gave_up_at IS NOT NULL))
ORDER BY a.id LIMIT :limit
ON CONFLICT (alert_id, url) DO UPDATE SET tries = alert_deliveries.tries + 1,
                                          due_at = excluded.due_at
WHERE alert_deliveries.due_at <= :now AND alert_deliveries.delivered_at IS NULL
  AND alert_deliveries.gave_up_at IS NULL
RETURNING alert_id, url, tries

-- name: record_alert_delivery
-- What an attempt came to, only while it is the last one taken (the fence) and its
-- delivery is not settled; the last failure's error is kept once delivered.
UPDATE alert_deliveries
SET delivered_at = :delivered_at, gave_up_at = :gave_up_at, due_at = :due_at,
    last_error = COALESCE(CAST(:error AS TEXT), last_error)
WHERE alert_id = :alert_id AND url = :url AND tries = :attempt
  AND delivered_at IS NULL AND gave_up_at IS NULL
RETURNING alert_id

-- name: select_alert_deliveries
SELECT {delivery_read} FROM alert_deliveries WHERE alert_id = :alert_id ORDER BY url

-- name: count_ended
-- The tasks that ended since :since, by minute and state: the dashboard's throughput,
-- over the partial index tasks_ended.
SELECT CAST((ended_at - :since) / 60 AS INTEGER) AS minute, state, COUNT(*) AS tasks
FROM tasks WHERE {ended} AND ended_at >= :since
GROUP BY CAST((ended_at - :since) / 60 AS INTEGER), state

-- name: count_tasks
-- By state, for the dashboard's header: a scan of the index tasks_state (PostgreSQL)
-- or tasks_listed (SQLite), so it grows with the store; the web app keeps the
-- answer for a moment rather than ask at every page.
SELECT state, COUNT(*) AS tasks FROM tasks GROUP BY state

-- name: census_versions
-- What unfinished work needs (R4): tasks by workflow and version (index tasks_state),
-- and the agent of the unit each is at. Cost grows with the unfinished tasks, not the
-- store; the supervisor takes this census seldom (Supervisor.census_interval): with
-- 20,000 tasks queued it took 70 ms on SQLite and 120 ms on PostgreSQL here.
SELECT workflow, version, COUNT(*) AS tasks FROM tasks
WHERE {unfinished}
GROUP BY workflow, version

-- name: census_agents
SELECT t.workflow, t.version, s.agent, COUNT(*) AS tasks FROM tasks t
JOIN steps s ON s.task_id = t.task_id AND s.phase = 'do' AND s.idx = t.cursor
WHERE t.{unfinished}
GROUP BY t.workflow, t.version, s.agent

-- name: select_open_incidents
-- (unordered: with ORDER BY id SQLite scans every alert rather than use alerts_open)
SELECT {alert_read} FROM alerts
WHERE incident IS NOT NULL AND resolved_at IS NULL

-- name: resolve_incident
UPDATE alerts SET resolved_at = :now WHERE incident = :incident AND resolved_at IS NULL

-- name: insert_incident
INSERT INTO alerts (task_id, step, agent, at, message, incident, count)
VALUES (NULL, NULL, :agent, :now, :message, :incident, :count)

-- name: select_unversioned
-- Tasks written before versions existed: each gets its version from its own steps.
SELECT t.task_id, t.workflow, s.name, s.agent FROM tasks t
JOIN steps s ON s.task_id = t.task_id AND s.phase = 'do'
WHERE t.version IS NULL ORDER BY t.task_id, s.idx

-- name: set_version
UPDATE tasks SET version = :version WHERE task_id = :task_id

-- name: acquire_lease
-- Take the lease if it is free, expired, or already ours; a new holder bumps the epoch.
INSERT INTO leases (name, holder, epoch, expires_at) VALUES (:name, :holder, 1, :expires_at)
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch
                 ELSE leases.epoch + 1 END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
WHERE leases.holder = excluded.holder OR leases.expires_at < :now
RETURNING holder, epoch

-- name: beat
-- A worker instance's heartbeat: its row, renewed; started_at stays as written by the
-- first beat of the process now using the id.
INSERT INTO instances (instance_id, host, pid, roles, agents, workflows, lease, started_at,
                       beat_at)
VALUES (:instance_id, :host, :pid, :roles, :agents, :workflows, :lease, :now, :now)
ON CONFLICT (instance_id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, roles = excluded.roles,
    agents = excluded.agents, workflows = excluded.workflows, lease = excluded.lease,
    started_at = CASE WHEN :first THEN excluded.started_at ELSE instances.started_at END,
    beat_at = excluded.beat_at, stopped_at = NULL

-- name: mark_stopped
UPDATE instances SET stopped_at = :now WHERE instance_id = :instance_id

-- name: forget_instances
-- Rows of instances that have not beaten since `before` and hold no task: gone for
-- good (a pod replaced, a host retired). One that still holds a task is kept for
-- the supervisors to find its orphans by.
DELETE FROM instances
WHERE beat_at < :before
  AND instance_id NOT IN (SELECT locked_by FROM tasks WHERE locked_by IS NOT NULL)
RETURNING instance_id

-- name: insert_dead_letter
-- a repeated insert (a retried commit) changes nothing
INSERT INTO dead_letters (id, queue, reason, deliveries, first_seen, at, body)
VALUES (:id, :queue, :reason, :deliveries, :first_seen, :at, :body)
ON CONFLICT (id) DO NOTHING

-- name: oldest_dead_letters
SELECT id, queue, reason, deliveries, first_seen, at, body FROM dead_letters
ORDER BY at, id LIMIT :limit

-- name: one_dead_letter
SELECT id, queue, reason, deliveries, first_seen, at, body FROM dead_letters WHERE id = :id

-- name: purge_dead_letters
DELETE FROM dead_letters RETURNING 1

-- name: select_migrations
SELECT version FROM schema_migrations

-- name: insert_migration
INSERT INTO schema_migrations VALUES (:version, :applied_at)
