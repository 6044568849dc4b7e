"""The PostgreSQL store's SQL: sql.py's statements in PostgreSQL's words.

The differences from sql.py are the dialect only: `%s` parameters with explicit
types where a NULL parameter would leave PostgreSQL guessing, `IS NOT DISTINCT
FROM` for SQLite's `IS`, `GREATEST` for the scalar `MAX`, `= ANY(%s)` for lists,
and `FOR UPDATE SKIP LOCKED` where SQLite relies on its one writer. Writes come
in batches (group commit), so they are bulk statements over arrays (at the end).
Column order of a task row is sql.TASK_COLUMNS everywhere.
"""

from __future__ import annotations

from sasflow.store import sql
from sasflow.store.sql import ALERT_COLUMNS, CLAIMABLE_SQL, TASK_COLUMNS

# Statements with no parameters or dialect of their own: the same text (R4 census,
# the versions of tasks written before versions existed).
CENSUS_VERSIONS = sql.CENSUS_VERSIONS
CENSUS_AGENTS = sql.CENSUS_AGENTS
SELECT_OPEN_INCIDENTS = sql.SELECT_OPEN_INCIDENTS
SELECT_UNVERSIONED = sql.SELECT_UNVERSIONED

# The store's sessions run short statements whose plans are cached (prepared). A
# cached generic plan can be estimated costly enough to be compiled by the JIT,
# which takes ~150 ms each time, for a query that runs in a tenth of a millisecond
# (the supervisor's sweep did, under load): never worth it here.
SESSION_SETUP = "SET jit = off"

SELECT_TASK_IDENTITY = "SELECT workflow, input FROM tasks WHERE task_id = %s"
SELECT_TASK_IDENTITIES = "SELECT task_id, workflow, input FROM tasks WHERE task_id = ANY(%s)"

# Which of these tasks a write with this token wrote last (tasks.last_write): how a
# writer whose connection died before the answer came learns whether it committed.
SELECT_WRITTEN = "SELECT task_id FROM tasks WHERE task_id = ANY(%s) AND last_write = %s"

# Idle schedulers LISTEN here; the payload is when the work becomes claimable.
# NOTIFY is transactional: it is delivered at commit, and not at all on rollback.
WORK_CHANNEL = "sasflow_work"
LISTEN_WORK = f"LISTEN {WORK_CHANNEL}"

DELETE_OUTBOX = "DELETE FROM outbox WHERE id = ANY(%s)"

SELECT_TASK = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = %s"

# A task's step rows as one JSON array (the columns of SELECT_STEPS but task_id),
# so a task and its steps come in one statement from one snapshot.
STEPS_AS_JSON = """
(SELECT json_agg(json_build_array(s.phase, s.idx, s.name, s.agent, s.state, s.attempts,
                                  s.failure_count, s.complete_by, s.idempotency_key,
                                  s.result, s.error, s.in_doubt) ORDER BY s.phase, s.idx)::text
 FROM steps s WHERE s.task_id = tasks.task_id)
"""

_TASKS_WITH_STEPS = f"SELECT {TASK_COLUMNS}, {STEPS_AS_JSON} FROM tasks"
SELECT_TASKS_WITH_STEPS = f"{_TASKS_WITH_STEPS} WHERE task_id = ANY(%s)"
# One task (get, wait): `= %s` rather than a one-element `= ANY(%s)`, whose array
# costs ~100 µs more a read (psycopg adapts it, the server parses it).
SELECT_TASK_WITH_STEPS = f"{_TASKS_WITH_STEPS} WHERE task_id = %s"

# Served by the partial index tasks_locked: cost grows with what has expired.
SELECT_EXPIRED = f"""
SELECT {TASK_COLUMNS}, {STEPS_AS_JSON} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by < %s
ORDER BY complete_by LIMIT %s
"""

NEXT_EXPIRY = "SELECT MIN(complete_by) FROM tasks WHERE locked_by IS NOT NULL"

# The same per workflow (the supervisor's, R4): ordered range scans of the partial
# index tasks_expiring, each workflow's earliest first; merged in the query.
SELECT_EXPIRED_OF = f"""
SELECT e.* FROM unnest(%s::text[]) AS w(name), LATERAL (
    SELECT {TASK_COLUMNS}, {STEPS_AS_JSON} FROM tasks
    WHERE workflow = w.name AND locked_by IS NOT NULL AND complete_by < %s
    ORDER BY complete_by LIMIT %s) AS e
ORDER BY e.complete_by LIMIT %s
"""

NEXT_EXPIRY_OF = """
SELECT MIN(e.due) FROM unnest(%s::text[]) AS w(name), LATERAL (
    SELECT MIN(complete_by) AS due FROM tasks
    WHERE workflow = w.name AND locked_by IS NOT NULL) AS e
"""

LIST_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE (%s::text IS NULL OR state = %s::text) AND (%s::text IS NULL OR workflow = %s::text)
ORDER BY created_at, task_id LIMIT %s
"""

SELECT_HISTORY = """
SELECT step, phase, at, actor, epoch, from_state, to_state, why FROM history
WHERE task_id = %s ORDER BY id
"""

SELECT_ALERTS = f"SELECT {ALERT_COLUMNS} FROM alerts WHERE id > %s ORDER BY id LIMIT %s"

RESOLVE_INCIDENT = """
UPDATE alerts SET resolved_at = %(now)s
WHERE incident = %(incident)s AND resolved_at IS NULL
"""

INSERT_INCIDENT = """
INSERT INTO alerts (task_id, step, agent, at, message, incident, count)
VALUES (NULL, NULL, %(agent)s, %(now)s, %(message)s, %(incident)s, %(count)s)
"""

SET_VERSION = "UPDATE tasks SET version = %s WHERE task_id = %s"

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

# A worker instance's heartbeat: its row, renewed; started_at stays as first written.
BEAT = """
INSERT INTO instances (instance_id, host, pid, roles, agents, workflows, lease, started_at,
                       beat_at)
VALUES (%(instance_id)s, %(host)s, %(pid)s, %(roles)s, %(agents)s, %(workflows)s,
        %(lease)s, %(now)s, %(now)s)
ON CONFLICT (instance_id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, roles = excluded.roles,
    agents = excluded.agents, workflows = excluded.workflows, lease = excluded.lease,
    started_at = CASE WHEN %(first)s THEN excluded.started_at ELSE instances.started_at END,
    beat_at = excluded.beat_at, stopped_at = NULL
"""

MARK_STOPPED = ("UPDATE instances SET stopped_at = %(now)s"
                " WHERE instance_id = %(instance_id)s")

SELECT_INSTANCES = """
SELECT instance_id, host, pid, roles::text, agents::text, workflows::text,
       started_at, beat_at, stopped_at, lease
FROM instances
WHERE %(instance_id)s::text IS NULL OR instance_id = %(instance_id)s::text
ORDER BY started_at, instance_id
"""

# Tasks still locked by an instance that is gone (as sql.SELECT_ORPHANED), with
# their steps.
SELECT_ORPHANED = f"""
SELECT {TASK_COLUMNS}, {STEPS_AS_JSON} FROM tasks
WHERE locked_by IS NOT NULL AND complete_by IS NOT NULL
  AND EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = tasks.locked_by
              AND (i.stopped_at IS NOT NULL OR i.beat_at + i.lease < %(now)s
                   OR tasks.updated_at < i.started_at - 1.0))
  AND (%(workflows)s::text[] IS NULL OR workflow = ANY(%(workflows)s::text[]))
ORDER BY complete_by LIMIT %(limit)s
"""

# One workflow version at a time: an ordered range scan of the partial index
# tasks_claimable; only the versions this scheduler declares (R4, M4).
# SKIP LOCKED: rows another scheduler is claiming right now are passed over, not
# waited for, so concurrent claims take disjoint tasks without blocking (M1).
SELECT_CLAIMABLE = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE workflow = %s AND version = %s AND available_at <= %s
  AND {CLAIMABLE_SQL}
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

# ---------------------------------------------------------------- bulk writes
# A group-commit batch writes each kind of row with one statement whatever its
# size. The rows travel as ONE parameter, a JSON array of row arrays (msgspec
# encodes it in C, where psycopg would adapt arrays value by value in Python),
# and `rows_of` turns it back into typed rows. Column order is that of the row
# tuples of store/rows.py. The parameter is read as jsonb, parsed once: as json,
# each `->>` parses its row's text again, and a batch spent most of its time there.


def rows_of(*columns: str) -> str:
    """SELECT the typed columns ("name type", ...) of the rows in a JSON parameter."""
    picked = []
    for n, column in enumerate(columns):
        name, kind = column.split()
        value = f"r.v->>{n}"
        picked.append(f"decode({value}, 'base64') AS {name}" if kind == "bytea"  # msgspec's
                      else f"({value})::{kind} AS {name}")                       # bytes
    return f"SELECT {', '.join(picked)} FROM jsonb_array_elements(%s::jsonb) AS r(v)"


_TRANSITION = ("state text", "phase text", "cursor int", "locked_by text",
               "complete_by float8", "available_at float8", "failure_count int", "error text",
               "new_epoch bigint", "updated_at float8", "version text", "task_id text",
               "epoch bigint", "from_state text", "owner text", "from_phase text",
               "from_cursor int", "from_version text", "expired_before float8", "lease text",
               "lease_holder text", "lease_epoch bigint",
               "wake float8",  # when the task is claimable again, if this releases it
               "token bigint")  # the write's, into last_write
_NEW_TASK = ("task_id text", "workflow text", "input text", "state text",
             "available_at float8", "reply_to text", "created_at float8", "updated_at float8",
             "last_write bigint", "version text")
_NEW_STEP = ("task_id text", "phase text", "idx int", "name text", "agent text", "state text",
             "idempotency_key text", "updated_at float8")
_STEP = ("task_id text", "phase text", "idx int", "name text", "agent text", "state text",
         "attempts int", "failure_count int", "complete_by float8", "idempotency_key text",
         "result text", "error text", "in_doubt int", "updated_at float8")
_HISTORY = ("task_id text", "step text", "phase text", "at float8", "actor text",
            "epoch bigint", "from_state text", "to_state text", "why text")
_OUTBOX = ("task_id text", "queue text", "body bytea", "created_at float8")  # task_id: a tag
_ALERT = ("task_id text", "step text", "agent text", "at float8", "message text")

_INSERT_HISTORY = """INSERT INTO history (task_id, step, phase, at, actor, epoch, from_state,
                                          to_state, why)"""

# A batch of transitions in ONE statement (its parameters: the transitions, then the
# step, history, outbox and alert rows they imply, each as JSON):
# - `locked`: the batch's task rows, locked in task-id order first, so every batch
#   of every process waits for rows in the same order (no deadlock);
# - `applied`: the fence (DESIGN invariants 2 and 4) for the whole batch: same
#   epoch, state, owner, unit (phase, cursor) and version as when read, and (supervisor)
#   a complete-by that has passed and the lease still held with its epoch; a task
#   not in it is left exactly as it was;
# - the implied rows are written for the applied transitions only: each unit's row
#   with the values the transition carries (rows.implied_rows);
# - idle schedulers are told (NOTIFY) when an applied transition released work.
# A batch holds one transition per task, so no step row comes twice (which
# ON CONFLICT DO UPDATE refuses). One statement is one transaction: it needs no
# BEGIN or COMMIT. Answers the ids of the tasks it applied to.
APPLY_TRANSITIONS = f"""
WITH v AS ({rows_of(*_TRANSITION)}),
locked AS (SELECT task_id FROM tasks WHERE task_id IN (SELECT task_id FROM v)
           ORDER BY task_id FOR UPDATE),
applied AS (
    UPDATE tasks t SET state = v.state, phase = v.phase, cursor = v.cursor,
           locked_by = v.locked_by, complete_by = v.complete_by,
           available_at = v.available_at, failure_count = v.failure_count, error = v.error,
           epoch = v.new_epoch, updated_at = v.updated_at, last_write = v.token,
           version = v.version
    FROM v JOIN locked USING (task_id)
    WHERE t.task_id = v.task_id AND t.epoch = v.epoch AND t.state = v.from_state
      AND t.locked_by IS NOT DISTINCT FROM v.owner
      AND t.phase = v.from_phase AND t.cursor = v.from_cursor
      AND t.version IS NOT DISTINCT FROM v.from_version
      AND (v.expired_before IS NULL OR t.complete_by < v.expired_before)
      AND (v.lease IS NULL OR EXISTS (SELECT 1 FROM leases l WHERE l.name = v.lease
                                      AND l.holder = v.lease_holder AND l.epoch = v.lease_epoch))
    RETURNING t.task_id),
wrote_steps AS (
    INSERT INTO steps (task_id, phase, idx, name, agent, state, attempts, failure_count,
                       complete_by, idempotency_key, result, error, in_doubt, updated_at)
    SELECT * FROM ({rows_of(*_STEP)}) s WHERE s.task_id IN (SELECT task_id FROM applied)
    ON CONFLICT (task_id, phase, idx) DO UPDATE SET
        name = excluded.name, agent = excluded.agent, state = excluded.state,
        attempts = excluded.attempts, failure_count = excluded.failure_count,
        complete_by = excluded.complete_by, idempotency_key = excluded.idempotency_key,
        result = excluded.result, error = excluded.error, in_doubt = excluded.in_doubt,
        updated_at = excluded.updated_at),
wrote_history AS (
    {_INSERT_HISTORY}
    SELECT * FROM ({rows_of(*_HISTORY)}) h WHERE h.task_id IN (SELECT task_id FROM applied)),
wrote_outbox AS (
    INSERT INTO outbox (queue, body, created_at)
    SELECT queue, body, created_at FROM ({rows_of(*_OUTBOX)}) o
    WHERE o.task_id IN (SELECT task_id FROM applied)),
wrote_alerts AS (
    INSERT INTO alerts (task_id, step, agent, at, message)
    SELECT * FROM ({rows_of(*_ALERT)}) a WHERE a.task_id IN (SELECT task_id FROM applied))
SELECT array_agg(a.task_id),
       (SELECT pg_notify('{WORK_CHANNEL}', min(v.wake)::text)::text
        FROM v WHERE v.wake IS NOT NULL AND v.task_id IN (SELECT task_id FROM applied)
        HAVING count(*) > 0)
FROM applied a
"""

# A batch of submissions in one statement (parameters: the tasks, their steps,
# history and outbox rows); the rows of a task that existed already are not
# written; idle schedulers are told if any was created. Answers the ids of the
# tasks created.
INSERT_TASKS = f"""
WITH created AS (
    INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to, created_at,
                       updated_at, last_write, version)
    {rows_of(*_NEW_TASK)}
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id, available_at),
wrote_steps AS (
    INSERT INTO steps (task_id, phase, idx, name, agent, state, idempotency_key, updated_at)
    SELECT * FROM ({rows_of(*_NEW_STEP)}) s WHERE s.task_id IN (SELECT task_id FROM created)),
wrote_history AS (
    {_INSERT_HISTORY}
    SELECT * FROM ({rows_of(*_HISTORY)}) h WHERE h.task_id IN (SELECT task_id FROM created)),
wrote_outbox AS (
    INSERT INTO outbox (queue, body, created_at)
    SELECT queue, body, created_at FROM ({rows_of(*_OUTBOX)}) o
    WHERE o.task_id IN (SELECT task_id FROM created))
SELECT array_agg(task_id),
       CASE WHEN count(*) > 0
            THEN pg_notify('{WORK_CHANNEL}', min(available_at)::text)::text END
FROM created
"""

# What a rare transition also needs, once it is known that it applied: a migration
# to a shorter shape drops the step rows past its end (plan.Plan.migrate).
DROP_STEPS = f"""
DELETE FROM steps s USING ({rows_of("task_id text", "idx int")}) AS v
WHERE s.task_id = v.task_id AND s.phase = 'do' AND s.idx >= v.idx
"""
