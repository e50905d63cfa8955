-- The statements of the followers, their checkpoints and the webhooks (ledger/feed/), by
-- name; read through ledger/feed/sql.py. Slots in braces are filled from the store's
-- dialect (ledger/stores/named.py).

-- ---------------------------------------------------------------------------
-- checkpoints.py: one lg_followers row per follower
-- ---------------------------------------------------------------------------

-- name: create_checkpoint
INSERT INTO lg_followers (name, position, run_id, kinds, created_at, updated_at, owner)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING;

-- name: checkpoint
SELECT position FROM lg_followers WHERE name = ?;

-- name: checkpoint_with_bound
-- the checkpoint with the database clock and the feed's readable bound (PostgreSQL:
-- columns of the same statement, one round trip)
SELECT position{now_column}{readable_column} FROM lg_followers WHERE name = ?;

-- name: checkpoint_with_bound_locked
-- the same, the row locked until the transaction ends (PostgreSQL)
SELECT position{now_column}{readable_column} FROM lg_followers WHERE name = ? {lock};

-- name: move_checkpoint
UPDATE lg_followers SET position = ?, updated_at = ?, owner = ?, run_id = ?, kinds = ?
WHERE name = ? AND position = ?;

-- name: advance_checkpoint
UPDATE lg_followers SET position = ?, updated_at = ?, owner = ?, run_id = ?, kinds = ?
WHERE name = ? AND position = ? RETURNING name;

-- name: relax_commit
-- PostgreSQL only: this transaction's commit does not wait for the disk
SET LOCAL synchronous_commit = off;

-- name: followers
SELECT * FROM lg_followers ORDER BY name;

-- name: follower_filter
SELECT run_id, kinds FROM lg_followers WHERE name = ?;

-- name: lag
-- the transitions after a checkpoint, counted (and the oldest one's time), for each
-- filter a follower may have: none, a run, kinds (one list parameter, given twice), both
SELECT COUNT(*) AS n, MIN(at) AS oldest FROM lg_transitions WHERE position > ?;

-- name: lag_of_run
SELECT COUNT(*) AS n, MIN(at) AS oldest FROM lg_transitions WHERE position > ? AND run_id = ?;

-- name: lag_of_kinds
SELECT COUNT(*) AS n, MIN(at) AS oldest FROM lg_transitions
WHERE position > ? AND (command {in_list} OR to_state {in_list});

-- name: lag_of_run_kinds
SELECT COUNT(*) AS n, MIN(at) AS oldest FROM lg_transitions
WHERE position > ? AND run_id = ? AND (command {in_list} OR to_state {in_list});

-- name: try_session_lock
SELECT pg_try_advisory_lock(?);

-- name: session_alive
SELECT 1;

-- name: session_unlock
SELECT pg_advisory_unlock(?);

-- name: add_webhook
INSERT INTO lg_webhooks (webhook_id, url, secret, run_id, kinds, created_at, allow_http,
allow_host, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: webhook
SELECT * FROM lg_webhooks WHERE webhook_id = ?;

-- name: webhook_locked
-- the webhook's row, locked until the transaction ends (PostgreSQL): one change at a time
SELECT * FROM lg_webhooks WHERE webhook_id = ? {lock};

-- name: change_webhook
UPDATE lg_webhooks SET url = ?, secret = ?, allow_http = ?, allow_host = ?,
previous_secret = ?, previous_until = ?, updated_at = ? WHERE webhook_id = ?;

-- name: webhook_secrets
SELECT webhook_id, secret, previous_secret FROM lg_webhooks ORDER BY webhook_id {lock};

-- name: reseal_webhook
UPDATE lg_webhooks SET secret = ?, previous_secret = ? WHERE webhook_id = ?;

-- name: webhook_changes
SELECT * FROM lg_webhook_changes ORDER BY at DESC, webhook_id, version DESC LIMIT ?;

-- name: webhook_changes_of_webhook
SELECT * FROM lg_webhook_changes WHERE webhook_id = ? ORDER BY version DESC LIMIT ?;

-- name: webhook_exists
SELECT 1 AS x FROM lg_webhooks WHERE webhook_id = ?;

-- name: webhooks
SELECT * FROM lg_webhooks ORDER BY created_at, webhook_id;

-- name: remove_webhook
DELETE FROM lg_webhooks WHERE webhook_id = ? RETURNING webhook_id;

-- name: remove_follower
DELETE FROM lg_followers WHERE name = ?;

-- name: deliveries
SELECT * FROM lg_webhook_deliveries
ORDER BY at DESC, position DESC, attempt DESC LIMIT ?;

-- name: deliveries_of_webhook
SELECT * FROM lg_webhook_deliveries WHERE webhook_id = ?
ORDER BY at DESC, position DESC, attempt DESC LIMIT ?;

-- name: delivery_tries
SELECT MAX(attempt) AS n, MAX(ok) AS ok FROM lg_webhook_deliveries
WHERE webhook_id = ? AND position = ?;

-- name: record_delivery
INSERT INTO lg_webhook_deliveries (webhook_id, position, attempt, message_id,
status, ok, error, at, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);
