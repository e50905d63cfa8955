-- postgres schema version 2: hash chain. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS ledger_event_hashes (originator_id UUID NOT NULL, originator_version BIGINT NOT NULL, hash TEXT NOT NULL, PRIMARY KEY (originator_id, originator_version));

INSERT INTO ledger_meta (key, value) SELECT 'hash_chain_from', COALESCE(MAX(notification_id), 0)::text FROM ledger_events;
