-- postgres schema version 16: webhook changes in the event log. Released: never edit; add a new version.

-- the position of the webhook event (ledger/core/webhook_events.py) each change row was
-- written from; NULL on a change recorded before the event log held them
ALTER TABLE lg_webhook_changes ADD COLUMN position BIGINT;

CREATE INDEX IF NOT EXISTS lg_webhook_changes_position ON lg_webhook_changes (position);

CREATE INDEX IF NOT EXISTS lg_webhook_changes_actor ON lg_webhook_changes (actor_id, position);
