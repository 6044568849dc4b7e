-- sasflow schema 1: tasks, their units of work, history, alerts, outbox, leases.
-- Times are seconds since the epoch (REAL) on the store's clock.

CREATE TABLE tasks (
    task_id       TEXT PRIMARY KEY,
    workflow      TEXT NOT NULL,
    input         TEXT NOT NULL,              -- JSON
    state         TEXT NOT NULL,
    phase         TEXT NOT NULL DEFAULT 'do', -- do: forward; undo: compensating
    cursor        INTEGER NOT NULL DEFAULT 0, -- the step being run or undone
    locked_by     TEXT,
    complete_by   REAL,
    available_at  REAL NOT NULL,              -- not claimable before (backoff, park)
    failure_count INTEGER NOT NULL DEFAULT 0,
    epoch         INTEGER NOT NULL DEFAULT 0, -- fencing token, +1 on every claim
    reply_to      TEXT,
    error         TEXT,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL
);

-- What schedulers poll: only unlocked, runnable tasks are in this index, in the
-- order they may run, per workflow.
CREATE INDEX tasks_claimable ON tasks (workflow, available_at)
    WHERE locked_by IS NULL AND state IN ('pending', 'compensating');

-- What the supervisor sweeps: only locked tasks are in this index, so a sweep
-- costs what is expired, not the size of the store.
CREATE INDEX tasks_locked ON tasks (complete_by) WHERE locked_by IS NOT NULL;

CREATE INDEX tasks_state ON tasks (state, workflow);

-- One row per unit of work: a step (phase 'do') or its compensation ('undo').
CREATE TABLE steps (
    task_id         TEXT NOT NULL,
    phase           TEXT NOT NULL,
    idx             INTEGER NOT NULL,
    name            TEXT NOT NULL,
    agent           TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    failure_count   INTEGER NOT NULL DEFAULT 0,
    complete_by     REAL,
    idempotency_key TEXT NOT NULL,
    result          TEXT,                      -- JSON
    error           TEXT,
    in_doubt        INTEGER NOT NULL DEFAULT 0,
    updated_at      REAL NOT NULL,
    PRIMARY KEY (task_id, phase, idx)
) WITHOUT ROWID;

-- Append-only: every transition of a task or unit, who made it and why.
CREATE TABLE history (
    id         INTEGER PRIMARY KEY,
    task_id    TEXT NOT NULL,
    step       TEXT,
    phase      TEXT,
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    why        TEXT
);
CREATE INDEX history_task ON history (task_id);

CREATE TABLE alerts (
    id      INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL,
    step    TEXT,
    agent   TEXT,
    at      REAL NOT NULL,
    message TEXT NOT NULL
);

-- Status messages written with the state change they report, relayed later (E11).
CREATE TABLE outbox (
    id         INTEGER PRIMARY KEY,
    queue      TEXT NOT NULL,
    body         BLOB NOT NULL,
    created_at   REAL NOT NULL,
    leased_until REAL NOT NULL DEFAULT 0  -- a relay is publishing it until then
);
CREATE INDEX outbox_queue ON outbox (queue, id);

CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
