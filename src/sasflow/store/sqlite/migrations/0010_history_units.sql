-- sasflow schema 10 on SQLite: one history row a state change.
-- A transition wrote a history row for its task and one for each unit it moved (a
-- step completed, the next one started): eleven rows for a task of three steps. The
-- units' moves now ride in their transition's row, as a JSON array of [step, phase,
-- from_state, to_state] (`units`); a task of three steps writes five rows. The view
-- `history_entries` reads both kinds of row as the entries they record, in order
-- (`id`, then `part`: 0 the task's, then its units').
ALTER TABLE history ADD COLUMN units TEXT;
CREATE VIEW history_entries AS
SELECT id, 0 AS part, task_id, step, phase, at, actor, epoch, from_state, to_state, why
FROM history
UNION ALL
SELECT h.id, u.key + 1, h.task_id, json_extract(u.value, '$[0]'),
       json_extract(u.value, '$[1]'), h.at, h.actor, h.epoch,
       json_extract(u.value, '$[2]'), json_extract(u.value, '$[3]'), NULL
FROM history h, json_each(h.units) u
WHERE h.units IS NOT NULL;
