-- sqlite schema version 11: hashes on events. Released: never edit; add a new version.

ALTER TABLE stored_events ADD COLUMN hash TEXT;

UPDATE stored_events SET hash = (SELECT h.hash FROM ledger_event_hashes h WHERE h.originator_id = stored_events.originator_id AND h.originator_version = stored_events.originator_version);

DROP TABLE ledger_event_hashes;
