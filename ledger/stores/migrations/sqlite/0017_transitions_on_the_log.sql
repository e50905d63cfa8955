-- sqlite schema version 17: transitions on the event log. Released: never edit; add a new version.

-- each transition's typed columns on its event's row, written with the event
-- (ledger/core/recorded.py); NULL on an event that is no transition
ALTER TABLE stored_events ADD COLUMN run_id TEXT;

ALTER TABLE stored_events ADD COLUMN item_id TEXT;

ALTER TABLE stored_events ADD COLUMN command TEXT;

ALTER TABLE stored_events ADD COLUMN from_state TEXT;

ALTER TABLE stored_events ADD COLUMN to_state TEXT;

ALTER TABLE stored_events ADD COLUMN actor_id TEXT;

ALTER TABLE stored_events ADD COLUMN role TEXT;

ALTER TABLE stored_events ADD COLUMN at TEXT;

-- a row-value assignment from a correlated subquery (SQLite 3.15), not UPDATE ... FROM (3.33)
UPDATE stored_events SET (run_id, item_id, command, from_state, to_state, actor_id, role, at) = (SELECT t.run_id, t.item_id, t.command, t.from_state, t.to_state, t.actor_id, t.role, t.at FROM lg_transitions t WHERE t.position = stored_events.rowid) WHERE rowid IN (SELECT position FROM lg_transitions);

DROP TABLE lg_transitions;

-- the audits' indexes, of the transitions only (every read goes through the view below,
-- whose run_id IS NOT NULL the planner matches); an entry ends with the row's position
CREATE INDEX IF NOT EXISTS stored_events_run ON stored_events (run_id) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS stored_events_actor ON stored_events (actor_id) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS stored_events_role ON stored_events (role) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS stored_events_state ON stored_events (to_state) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS stored_events_at ON stored_events (at) WHERE run_id IS NOT NULL;

-- the transitions as the reads see them: a row of the log each, its reason and evidence
-- in the event's state (decoded by ledger/core/recorded.py)
CREATE VIEW lg_transitions AS SELECT rowid AS position, run_id, item_id, command, from_state, to_state, actor_id, role, at, originator_version AS revision, topic, state FROM stored_events WHERE run_id IS NOT NULL;
