-- PostgreSQL's own statements (queries.py): lists are arrays (`= ANY(:ids)`), a NULL
-- parameter gets an explicit type, `IS NOT DISTINCT FROM` stands for SQLite's `IS`,
-- and claims skip the rows another scheduler is claiming (`FOR UPDATE SKIP LOCKED`).
-- Writes come in batches (group commit), so they are bulk statements whose rows
-- travel as JSON ({transitions_rows}, {steps_rows}...: postgres/bulk.py).

-- fragment: steps
-- A task's unit rows as one JSON array of arrays (columns.STEP but task_id, in
-- order), so a task and its steps come in one statement from one snapshot.
, (SELECT json_agg(json_build_array({step_json}) ORDER BY s.phase, s.idx)::text
   FROM steps s WHERE s.task_id = tasks.task_id) AS steps

-- name: session_setup
-- The store's sessions run short statements whose plans are cached (prepared). A
-- cached generic plan can be estimated costly enough to be compiled by the JIT,
-- which takes ~150 ms each time, for a query that runs in a tenth of a millisecond
-- (the supervisor's sweep did, under load): never worth it here.
SET jit = off

-- name: session_bounds
-- How long a pooled session may sit inside one transaction waiting on its client, and
-- on a lock (stalled.py: the store's transactions take milliseconds, one open this
-- long has a client that stopped). Values in milliseconds.
SELECT set_config('idle_in_transaction_session_timeout', :bound_ms, false),
       set_config('lock_timeout', :lock_wait_ms, false)

-- name: end_stalled_transactions
-- End the sessions of this store (same database, role and application_name) that
-- have been inside one transaction for longer than `after` seconds, holding a
-- transaction id (they wrote or locked rows): their client stopped mid-write, and
-- their row locks hold up everyone else (stalled.py). A long read holds none, and
-- is left to run.
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS ended
FROM pg_stat_activity
WHERE datname = current_database() AND usename = current_user
  AND application_name = current_setting('application_name')
  AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL
  AND xact_start < clock_timestamp() - make_interval(secs => :after)

-- name: db_clock
SELECT extract(epoch FROM clock_timestamp())::double precision AS now

-- name: listen_work
-- Idle schedulers LISTEN here; the payload is when the work becomes claimable.
-- NOTIFY is transactional: it is delivered at commit, and not at all on rollback.
LISTEN sasflow_work

-- name: listen_finished
-- Clients' waiters LISTEN here (wake.py FinishedListener); the payload is the ids of
-- tasks a commit ended, one per line.
LISTEN sasflow_finished

-- name: listen_outbox
-- Outbox relays and status streams LISTEN here (wake.py listen_for_statuses): a
-- commit wrote status messages (E11).
LISTEN sasflow_outbox

-- name: still_there
-- A listener asks it after a quiet spell (wake.py): a server that does not answer it
-- in time is given up as gone, and the listener connects again.
SELECT 1

-- name: select_task_identities
SELECT task_id, workflow, input FROM tasks WHERE task_id = ANY(:task_ids)

-- name: select_written
-- Which of these tasks a write with this token wrote last (tasks.last_write): how a
-- writer whose connection died before the answer came learns whether it committed.
SELECT task_id FROM tasks WHERE task_id = ANY(:task_ids) AND last_write = :token

-- name: select_tasks
SELECT {task_columns}{steps} FROM tasks WHERE task_id = ANY(:task_ids)

-- fragment: bound_passed
-- A locked task the supervisor must look at: its bound (sweep_at, never after its
-- complete-by) has passed, or it has none (claimed by a release older than 0011
-- while the workers roll).
(sweep_at < :now OR sweep_at IS NULL)

-- name: select_expired_of
-- The supervisor's, per workflow it knows (R4): range scans of the partial index
-- tasks_expiring up to `now` (sweep_at is never after complete_by: 0011_sweep_at.sql),
-- each workflow's expired sorted earliest first; merged in the query.
SELECT e.* FROM unnest(:workflows::text[]) AS w(name), LATERAL (
    SELECT {task_columns}{steps} FROM tasks
    WHERE workflow = w.name AND locked_by IS NOT NULL
      AND {bound_passed} AND complete_by < :now
    ORDER BY complete_by, task_id LIMIT :limit) AS e
ORDER BY e.complete_by, e.task_id LIMIT :limit

-- name: next_expiry_of
-- The supervisor's alarm clock, per workflow it knows: the earliest complete-by of
-- the tasks whose sweep_at has passed, or the first sweep_at still ahead (no later
-- than its task's complete-by), whichever is earlier. And the bounds that passed
-- without their task expiring are moved up to its complete-by (`advanced`), so
-- that the sweep does not read them again; rows a writer holds are left for the
-- next look (SKIP LOCKED), in task-id order as every writer locks them.
WITH stale AS (
    SELECT task_id FROM tasks
    WHERE workflow = ANY(:workflows::text[]) AND locked_by IS NOT NULL
      AND {bound_passed} AND complete_by >= :now
    ORDER BY task_id FOR UPDATE SKIP LOCKED),
advanced AS (
    UPDATE tasks t SET sweep_at = t.complete_by FROM stale WHERE t.task_id = stale.task_id)
SELECT LEAST(MIN(e.passed), MIN(e.ahead)) AS due
FROM unnest(:workflows::text[]) AS w(name), LATERAL (
    SELECT (SELECT MIN(complete_by) FROM tasks
            WHERE workflow = w.name AND locked_by IS NOT NULL
              AND {bound_passed}) AS passed,
           (SELECT MIN(sweep_at) FROM tasks
            WHERE workflow = w.name AND locked_by IS NOT NULL AND sweep_at >= :now) AS ahead
    ) AS e

-- name: select_orphaned
-- Tasks still locked by an instance that is gone (as SQLite's select_orphaned, which
-- says why), with their steps.
SELECT {task_columns}{steps} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by IS NOT NULL
  AND EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = tasks.locked_by
              AND (i.stopped_at IS NOT NULL OR i.beat_at + i.lease < :now
                   OR tasks.updated_at < i.started_at - 1.0))
  AND (:workflows::text[] IS NULL OR workflow = ANY(:workflows::text[]))
ORDER BY complete_by, task_id LIMIT :limit

-- name: select_claimable
-- One workflow version at a time: an ordered range scan of the partial index
-- tasks_claimable; only the versions this scheduler declares (R4, M4).
-- SKIP LOCKED: rows another scheduler is claiming right now are passed over, not
-- waited for, so concurrent claims take disjoint tasks without blocking (M1).
SELECT {task_columns} FROM tasks
WHERE workflow = :workflow AND version = :version AND available_at <= :now
  AND {claimable}
ORDER BY available_at LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: select_steps
-- The claimed tasks' unit rows, read once they are locked, looked up id by id: the
-- steps fragment is a subquery per task, which PostgreSQL runs as a scan of
-- steps_pkey for that id whatever it knows of the table. `WHERE task_id =
-- ANY(:task_ids)` left the choice to the table's statistics, and on a table never
-- analyzed the planner takes each id to match a two-hundredth of the rows, and
-- reads the whole table instead (test_postgres_plans).
SELECT tasks.task_id{steps} FROM unnest(:task_ids::text[]) AS tasks(task_id)

-- name: lease_outbox
UPDATE outbox SET leased_until = :until
WHERE id IN (SELECT id FROM outbox
             WHERE leased_until < :now
               AND (:queues::text[] IS NULL OR queue = ANY(:queues::text[]))
             ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING id, queue, body

-- name: delete_outbox
DELETE FROM outbox WHERE id = ANY(:ids)

-- name: settle_alerts
-- Alerts the deliverer needs nothing more of leave the partial index
-- alerts_undelivered (as SQLite's settle_alerts, which says when).
UPDATE alerts SET delivery_done_at = :now
WHERE delivery_done_at IS NULL
  AND (acknowledged_at IS NOT NULL OR at < :oldest
       OR NOT EXISTS (SELECT 1 FROM unnest(:webhooks::text[]) AS w(url) WHERE NOT EXISTS (
              SELECT 1 FROM alert_deliveries d WHERE d.alert_id = alerts.id AND d.url = w.url
                AND (d.delivered_at IS NOT NULL OR d.gave_up_at IS NOT NULL
                     OR (d.tries >= :max_tries AND d.due_at <= :now)))))

-- name: select_alerts_of
SELECT {alert_read} FROM alerts WHERE id = ANY(:ids::bigint[])

-- name: migration_lock
-- Migrations: serialised across processes by a transaction-level advisory lock.
SELECT pg_advisory_xact_lock(hashtext('sasflow.schema_migrations'))

-- name: create_migrations
CREATE TABLE IF NOT EXISTS schema_migrations (
    version text PRIMARY KEY, applied_at double precision NOT NULL)

-- name: schema_migrations_exists
SELECT to_regclass('schema_migrations') IS NOT NULL AS found

-- fragment: write_implied
-- The unit, history and outbox rows of the writes that applied (CTE `written`): each
-- unit's row with the values the write carries (rows.implied_rows).
wrote_steps AS (
    INSERT INTO steps ({step_columns})
    SELECT * FROM ({steps_rows}) s WHERE s.task_id IN (SELECT task_id FROM written)
    ON CONFLICT (task_id, phase, idx) DO UPDATE SET {step_updates}),
wrote_history AS (
    INSERT INTO history ({history_columns})
    SELECT * FROM ({history_rows}) h WHERE h.task_id IN (SELECT task_id FROM written)),
wrote_outbox AS (
    INSERT INTO outbox (queue, body, created_at)
    SELECT queue, body, created_at FROM ({outbox_rows}) o
    WHERE o.task_id IN (SELECT task_id FROM written))

-- fragment: created
-- The submitted tasks' rows; a task that existed already is left as it was (the
-- caller learns why from its identity: bulk.py).
created AS (
    INSERT INTO tasks ({new_task_columns}, sweep_at)
    SELECT n.*, n.complete_by FROM ({tasks_rows}) n
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id, available_at, locked_by)

-- fragment: applied
-- A batch's transitions (`v`) and the ids of those that applied (`applied`):
-- - `locked`: the transitions' task rows, locked in task-id order first, so every
--   batch of every process waits for rows in the same order (no deadlock). It finds
--   them by `task_id = ANY(ARRAY(...))`, an index lookup per id, and `applied` joins
--   `locked`, so by index too: the planner takes `v` for 100 rows whatever it
--   holds, and joined to tasks by `IN (SELECT ...)` it scanned the whole tasks
--   table twice for every batch (with 5,000 tasks stored: 2.5-3.9 ms a batch of
--   one, 1.1-2.3 ms now; a batch of 128 about the same);
-- - `applied`: the fence (DESIGN invariants 2 and 4) for the whole batch: same
--   epoch, state, owner, unit (phase, cursor) and version as when read, and
--   (supervisor) a complete-by that has passed and the lease still held with its
--   epoch; a task not in it is left exactly as it was. With each, when the task
--   becomes claimable if it released it (`wake`), and whether it ended it. The
--   task's `sweep_at`, the supervisor's bound, is kept while its owner does and it
--   is not after the new complete-by: a step then changes no indexed column, and
--   the row is rewritten in place (0011_sweep_at.sql).
v AS ({transitions_rows}),
locked AS (SELECT task_id FROM tasks WHERE task_id = ANY(ARRAY(SELECT task_id FROM v))
           ORDER BY task_id FOR UPDATE),
applied AS (
    UPDATE tasks t SET state = v.state, phase = v.phase, cursor = v.cursor,
           locked_by = v.locked_by, complete_by = v.complete_by,
           available_at = v.available_at, failure_count = v.failure_count, error = v.error,
           epoch = v.new_epoch, updated_at = v.updated_at, last_write = v.token,
           version = v.version, ended_at = v.ended_at, sweep_at = CASE
               WHEN v.locked_by IS NULL THEN NULL
               WHEN t.locked_by = v.locked_by AND t.sweep_at <= v.complete_by THEN t.sweep_at
               ELSE v.complete_by END
    FROM v JOIN locked USING (task_id)
    WHERE t.task_id = v.task_id AND t.epoch = v.epoch AND t.state = v.from_state
      AND t.locked_by IS NOT DISTINCT FROM v.owner
      AND t.phase = v.from_phase AND t.cursor = v.from_cursor
      AND t.version IS NOT DISTINCT FROM v.from_version
      AND (v.expired_before IS NULL OR t.complete_by < v.expired_before)
      AND (v.lease IS NULL OR EXISTS (SELECT 1 FROM leases l WHERE l.name = v.lease
                                      AND l.holder = v.lease_holder AND l.epoch = v.lease_epoch))
    RETURNING t.task_id, v.wake, v.finished)

-- fragment: wrote_alerts
-- The alerts of the transitions that applied.
wrote_alerts AS (
    INSERT INTO alerts ({alert_columns})
    SELECT * FROM ({alerts_rows}) a WHERE a.task_id IN (SELECT task_id FROM applied))

-- fragment: applied_answer
-- The ids of the tasks the transitions applied to, and of those they ended (which
-- waiting clients are told of after the commit: notify_finished); idle schedulers
-- are told (NOTIFY) of the work they released.
(SELECT array_agg(task_id) FROM applied) AS applied,
(SELECT array_agg(task_id) FILTER (WHERE finished) FROM applied) AS finished,
(SELECT pg_notify('sasflow_work', min(wake)::text)::text FROM applied
 WHERE wake IS NOT NULL HAVING count(*) > 0) AS released

-- fragment: created_answer
-- The ids of the tasks created; idle schedulers are told if one was created
-- unclaimed (not for one submitted already claimed).
(SELECT array_agg(task_id) FROM created) AS created,
(SELECT pg_notify('sasflow_work', min(available_at)::text)::text FROM created
 WHERE locked_by IS NULL HAVING count(*) > 0) AS submitted

-- name: apply_transitions
-- A batch of transitions in ONE statement (its parameters: the transitions, then the
-- step, history, outbox and alert rows they imply, each as JSON); the implied rows
-- are written for the applied transitions only (rows.implied_rows). A batch holds
-- one write per task, so no step row comes twice (which ON CONFLICT DO UPDATE
-- refuses). One statement is one transaction: it needs no BEGIN or COMMIT.
WITH {applied},
written AS (SELECT task_id FROM applied),
{write_implied},
{wrote_alerts}
SELECT {applied_answer}

-- name: insert_tasks
-- A batch of submissions in one statement (parameters: the tasks, their steps,
-- history and outbox rows); the rows of a task that existed already are not written.
WITH {created},
written AS (SELECT task_id FROM created),
{write_implied}
SELECT {created_answer}

-- name: write_batch
-- Transitions and submissions together, in ONE statement, as the two above would
-- write them (its parameters: those of both): a batch that mixes them costs one
-- round trip and one commit, not a transaction of two statements. Only here: the
-- two alone keep their own shorter plans (a batch of transitions alone cost 100 µs
-- more written this way, bench/pg_apply.py).
WITH {applied},
{created},
written AS (SELECT task_id FROM applied UNION ALL SELECT task_id FROM created),
{write_implied},
{wrote_alerts}
SELECT {applied_answer}, {created_answer}

-- name: notify_finished
-- The tasks a committed batch ended, one id per line (a task id is printable): sent
-- as a statement of its own, after the batch's. A NOTIFY in a writing transaction
-- holds the database's notify lock through the commit's WAL flush, so batches that
-- notified committed one at a time instead of sharing flushes (group commit); in a
-- statement that writes nothing it holds it for a moment. A batch whose answer is
-- lost tells no one: waiting clients poll too.
SELECT pg_notify('sasflow_finished', :ids)

-- name: notify_outbox
-- A committed batch wrote status messages: sent after it as notify_finished is.
SELECT pg_notify('sasflow_outbox', '')

-- name: drop_steps
-- What a rare transition also needs, once it is known that it applied: a migration
-- to a shorter shape drops the step rows past its end (plan.Plan.migrate).
DELETE FROM steps s USING ({drops_rows}) AS v
WHERE s.task_id = v.task_id AND s.phase = 'do' AND s.idx >= v.idx
