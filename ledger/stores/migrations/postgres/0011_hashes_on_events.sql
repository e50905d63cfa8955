-- postgres schema version 11: hashes on events. Released: never edit; add a new version.

ALTER TABLE ledger_events ADD COLUMN IF NOT EXISTS hash TEXT;

UPDATE ledger_events e SET hash = h.hash FROM ledger_event_hashes h WHERE h.originator_id = e.originator_id AND h.originator_version = e.originator_version;

DROP TABLE ledger_event_hashes;
