-- postgres schema version 17: transitions on the event log. Released: never edit; add a new version.

-- each transition's typed columns on its event's row, written with the event
-- (ledger/core/recorded.py); NULL on an event that is no transition
ALTER TABLE ledger_events ADD COLUMN IF NOT EXISTS run_id TEXT, ADD COLUMN IF NOT EXISTS item_id TEXT, ADD COLUMN IF NOT EXISTS command TEXT, ADD COLUMN IF NOT EXISTS from_state TEXT, ADD COLUMN IF NOT EXISTS to_state TEXT, ADD COLUMN IF NOT EXISTS actor_id TEXT, ADD COLUMN IF NOT EXISTS role TEXT, ADD COLUMN IF NOT EXISTS at TEXT;

UPDATE ledger_events e SET run_id = t.run_id, item_id = t.item_id, command = t.command, from_state = t.from_state, to_state = t.to_state, actor_id = t.actor_id, role = t.role, at = t.at FROM lg_transitions t WHERE t.position = e.notification_id;

DROP TABLE lg_transitions;

-- the audits' indexes, of the transitions only (every read goes through the view below,
-- whose run_id IS NOT NULL the planner matches); role and target state leave out the
-- values a filter on them is not selective for, as schema version 9 did
CREATE INDEX IF NOT EXISTS ledger_events_run ON ledger_events (run_id, notification_id) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS ledger_events_actor ON ledger_events (actor_id, notification_id) WHERE run_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS ledger_events_role ON ledger_events (role, notification_id) WHERE role <> 'worker';

CREATE INDEX IF NOT EXISTS ledger_events_state ON ledger_events (to_state, notification_id) WHERE to_state NOT IN ('in_progress', 'accepted');

CREATE INDEX IF NOT EXISTS ledger_events_at ON ledger_events (at, notification_id) WHERE run_id IS NOT NULL;

-- the transitions as the reads see them: a row of the log each, its reason and evidence
-- in the event's state (decoded by ledger/core/recorded.py), read as text: a transition's
-- state is UTF-8 JSON, and bytea goes to a client in hex, twice its size (the change feed
-- read 40% fewer rows a second)
CREATE VIEW lg_transitions AS SELECT notification_id AS position, run_id, item_id, command, from_state, to_state, actor_id, role, at, originator_version AS revision, topic, convert_from(state, 'UTF8') AS state FROM ledger_events WHERE run_id IS NOT NULL;
