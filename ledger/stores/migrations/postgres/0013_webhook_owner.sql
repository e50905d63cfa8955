-- postgres schema version 12: webhook owner. Released: never edit; add a new version.

-- who may deliver where: plain http and a host allowed to resolve to a private,
-- loopback, link-local or metadata address are each the operator's explicit choice
ALTER TABLE lg_webhooks ADD COLUMN allow_http INTEGER NOT NULL DEFAULT 0;

ALTER TABLE lg_webhooks ADD COLUMN allow_host TEXT;

-- the secret a rotation replaced, still signed with until previous_until
ALTER TABLE lg_webhooks ADD COLUMN previous_secret TEXT;

ALTER TABLE lg_webhooks ADD COLUMN previous_until TEXT;

ALTER TABLE lg_webhooks ADD COLUMN updated_at TEXT;

-- every add, change, removal and re-encryption of a webhook: who, in which role, why,
-- when, and what it then was (the secret only as its fingerprint); never updated or
-- deleted
CREATE TABLE IF NOT EXISTS lg_webhook_changes (
            webhook_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            command TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            role TEXT NOT NULL,
            reason TEXT NOT NULL,
            at TEXT NOT NULL,
            url TEXT NOT NULL,
            run_id TEXT,
            kinds TEXT,
            allow_http INTEGER NOT NULL,
            allow_host TEXT,
            secret_fingerprint TEXT,
            PRIMARY KEY (webhook_id, version)
        );

CREATE INDEX IF NOT EXISTS lg_webhook_changes_at ON lg_webhook_changes (at);
