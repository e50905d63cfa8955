-- postgres schema version 9: narrowed indexes. Released: never edit; add a new version.

DROP INDEX IF EXISTS lg_transitions_role;

DROP INDEX IF EXISTS lg_transitions_state;

DROP INDEX IF EXISTS lg_items_lease;

CREATE INDEX IF NOT EXISTS lg_items_lease ON lg_items (lease_expires_at) WHERE state = 'in_progress';

CREATE INDEX IF NOT EXISTS lg_transitions_role ON lg_transitions (role, position, ord) WHERE role <> 'worker';

CREATE INDEX IF NOT EXISTS lg_transitions_state ON lg_transitions (to_state, position, ord) WHERE to_state NOT IN ('in_progress', 'accepted');

ALTER TABLE lg_items SET (fillfactor = 50);

ALTER TABLE lg_attempts SET (fillfactor = 40);
