-- postgres schema version 4: feed. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS lg_followers (
            name TEXT PRIMARY KEY,
            position BIGINT NOT NULL,
            run_id TEXT,
            kinds TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            owner TEXT
        );

CREATE TABLE IF NOT EXISTS lg_webhooks (
            webhook_id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            secret TEXT NOT NULL,
            run_id TEXT,
            kinds TEXT,
            created_at TEXT NOT NULL
        );

CREATE TABLE IF NOT EXISTS lg_webhook_deliveries (
            webhook_id TEXT NOT NULL,
            position BIGINT NOT NULL,
            attempt INTEGER NOT NULL,
            message_id TEXT NOT NULL,
            status INTEGER,
            ok INTEGER NOT NULL,
            error TEXT,
            at TEXT NOT NULL,
            duration_ms INTEGER NOT NULL,
            PRIMARY KEY (webhook_id, position, attempt)
        );

CREATE INDEX IF NOT EXISTS lg_webhook_deliveries_at ON lg_webhook_deliveries (at);
