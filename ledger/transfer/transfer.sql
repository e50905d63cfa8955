-- The statements of export, archive and restore (ledger/transfer/), by name; read through
-- ledger/transfer/sql.py. Slots in braces are filled from the store's dialect and the
-- rule tables (ledger/stores/named.py).

-- name: run_exists
SELECT 1 AS x FROM lg_runs WHERE run_id = ?;

-- name: item_ids
SELECT item_id FROM lg_items WHERE run_id = ?;

-- name: events_between
-- the events stored after one position up to another
SELECT COUNT(*) AS n FROM {events} WHERE {position} > ? AND {position} <= ?;

-- name: run
SELECT * FROM lg_runs WHERE run_id = ?;

-- name: run_state
SELECT state, stopped_at FROM lg_runs WHERE run_id = ?;

-- name: terminal_runs_stopped_before
SELECT run_id FROM lg_runs WHERE state IN ({terminal_run_states}) AND stopped_at < ?
ORDER BY seq;

-- name: forget_run
DELETE FROM lg_runs WHERE run_id = ?;

-- name: run_links
SELECT links FROM lg_runs WHERE run_id = ?;

-- name: set_run_links
UPDATE lg_runs SET links = ? WHERE run_id = ?;

-- name: last_transition_of_run
-- the position of the run's last transition: where the change feed's readers must be
-- before its events may leave the store
SELECT MAX(position) AS p FROM lg_transitions WHERE run_id = ?;

-- name: followers_behind
-- the followers (webhooks are followers too) whose checkpoint is below a position
SELECT name, position FROM lg_followers WHERE position < ? ORDER BY name;

-- name: followers_at_or_past
-- the followers (webhooks are followers too) whose checkpoint is at or past a position
SELECT name, position, run_id, created_at FROM lg_followers WHERE position >= ? ORDER BY name;
