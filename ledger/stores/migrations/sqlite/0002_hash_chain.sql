-- sqlite schema version 2: hash chain. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS ledger_event_hashes (originator_id TEXT NOT NULL, originator_version INTEGER NOT NULL, hash TEXT NOT NULL, PRIMARY KEY (originator_id, originator_version));

INSERT INTO ledger_meta (key, value) SELECT 'hash_chain_from', CAST(COALESCE(MAX(rowid), 0) AS TEXT) FROM stored_events;
