-- sasflow schema 12 on PostgreSQL: one history row a state change.
-- A transition wrote a history row for its task and one for each unit it moved (a
-- step completed, the next one started): eleven rows, and twenty-two index entries,
-- for a task of three steps. The units' moves now ride in their transition's row, as
-- a JSON array of [step, phase, from_state, to_state] (`units`); a task of three
-- steps writes five rows. The view `history_entries` reads both kinds of row as the
-- entries they record, in order (`id`, then `part`: 0 the task's, then its units').
ALTER TABLE history ADD COLUMN units text;
CREATE VIEW history_entries AS
SELECT id, 0::bigint AS part, task_id, step, phase, at, actor, epoch, from_state,
       to_state, why
FROM history
UNION ALL
SELECT h.id, u.part, h.task_id, u.unit->>0, u.unit->>1, h.at, h.actor, h.epoch,
       u.unit->>2, u.unit->>3, NULL
FROM history h
CROSS JOIN LATERAL json_array_elements(h.units::json) WITH ORDINALITY AS u(unit, part)
WHERE h.units IS NOT NULL;
