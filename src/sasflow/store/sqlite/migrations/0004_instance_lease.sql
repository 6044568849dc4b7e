-- sasflow schema 4: each instance's heartbeat lease. An instance whose last beat
-- is older than beat_at + lease (store clock) counts as gone: health probes fail
-- for it, and supervisors release the tasks it still holds (R2).
ALTER TABLE instances ADD COLUMN lease REAL NOT NULL DEFAULT 10.0
