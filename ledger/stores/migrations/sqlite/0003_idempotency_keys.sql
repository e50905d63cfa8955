-- sqlite schema version 3: idempotency keys. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS ledger_idempotency (
            idempotency_key TEXT PRIMARY KEY,
            command TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            run_id TEXT,
            response TEXT NOT NULL,
            recorded_at TEXT NOT NULL
        );
