-- The projections' statements (ledger/stores/named.py: `?` for every value, `{slot}`s
-- filled from the store's dialect and the rule tables). A projection table is named by an
-- identifier slot (`{runs}`, `{items}`, `{counts}`, `{table}`): the live one, a rebuild's
-- (`_rebuild`) or verify's scratch copy.

-- the projector (ledger/projections/writer.py) -------------------------------

-- name: withdraw_item
UPDATE {items} SET in_manifest = 0 WHERE run_id = ? AND item_id = ?

-- name: insert_webhook_change
-- one webhook event's row (ledger/core/webhook_events.py, ROW_COLUMNS then the webhook id
-- again), numbered after the webhook's rows before it
INSERT INTO lg_webhook_changes (webhook_id, command, actor_id, role, reason, at, url, run_id,
kinds, allow_http, allow_host, secret_fingerprint, position, version)
SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(MAX(version), 0) + 1
FROM lg_webhook_changes WHERE webhook_id = ?

-- name: drop_counts
DELETE FROM {counts} WHERE run_id = ?

-- name: delete_run_rows
-- an archived run's rows of one table (items, attempts, transitions)
DELETE FROM {table} WHERE run_id = ?

-- loading aggregates (ledger/projections/replay.py, counts.py) -------------

-- name: load_runs
SELECT * FROM {runs} WHERE run_id {in_list}

-- name: load_items
SELECT * FROM {items} WHERE run_id = ? AND item_id {in_list}

-- name: load_items postgres
-- one search of the primary key per id, as `items_by_id_locked postgres`
-- (ledger/commands/commands.sql) says why
WITH p AS MATERIALIZED (SELECT CAST(? AS text) AS run_id, CAST(? AS text[]) AS ids)
SELECT i.* FROM p
CROSS JOIN LATERAL (SELECT DISTINCT u.item_id FROM unnest(p.ids) AS u (item_id)) AS n
CROSS JOIN LATERAL (SELECT * FROM {items} AS t WHERE t.run_id = p.run_id
AND t.item_id = n.item_id LIMIT 1) AS i

-- name: run_counts
-- each run's counts column and its slot rows' sums per state, in one snapshot
SELECT r.run_id, r.counts, c.state, SUM(c.n) AS n FROM {runs} r
LEFT JOIN {counts} c ON c.run_id = r.run_id WHERE r.run_id {in_list}
GROUP BY r.run_id, r.counts, c.state

-- name: run_amended_by
-- whether an actor amended a run before a position (the rule checker: it may not decide
-- the run's review); the transitions are the event log's (ledger/core/recorded.py)
SELECT position FROM lg_transitions WHERE run_id = ? AND item_id IS NULL
AND command IN ('amend', 'weaken_acceptance') AND actor_id = ? AND position < ? LIMIT 1

-- name: required_not_accepted
SELECT item_id, state FROM {items}
WHERE run_id = ? AND in_manifest = 1 AND required = 1 AND state <> {s_accepted}
ORDER BY seq LIMIT ?

-- the events a replay reads (ledger/projections/rebuild.py) --------------------

-- name: count_events
SELECT COUNT(*) AS n FROM {events}

-- name: count_events_upto
SELECT COUNT(*) AS n FROM {events} WHERE {position} <= ?

-- name: last_position
SELECT MAX({position}) AS p FROM {events}

-- the rebuild's tracking row ---------------------------------------------------

-- name: tracked_position
SELECT position FROM lg_tracking WHERE name = ?

-- name: tracked_position_locked
SELECT position FROM lg_tracking WHERE name = ? {lock}

-- name: start_tracking
-- RETURNING, not rowcount: it is read back even when statements are pipelined
INSERT INTO lg_tracking (name, position) VALUES (?, 0)
ON CONFLICT (name) DO NOTHING RETURNING name

-- name: move_tracking
UPDATE lg_tracking SET position = ? WHERE name = ?

-- name: end_tracking
DELETE FROM lg_tracking WHERE name = ?

-- tables (a rebuild's switch, verify's scratch tables) --------------------------

-- name: drop_table
DROP TABLE IF EXISTS {table}

-- name: rename_table
ALTER TABLE {table} RENAME TO {new}

-- name: rename_index
-- PostgreSQL
ALTER INDEX {index} RENAME TO {new}

-- name: rename_constraint
-- PostgreSQL
ALTER TABLE {table} RENAME CONSTRAINT {constraint} TO {new}

-- name: settle
-- PostgreSQL: a statement never prepared, after DDL (rebuild.settle_ddl)
SELECT 1

-- name: sqlite_indexes
-- SQLite: the definitions of a table's own indexes
SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL

-- name: pg_live_indexes
-- PostgreSQL: a table's indexes that no constraint owns
SELECT i.indexname, i.indexdef FROM pg_indexes i
WHERE i.schemaname = current_schema() AND i.tablename = ?
AND NOT EXISTS (SELECT 1 FROM pg_constraint c
  WHERE c.conindid = (quote_ident(i.schemaname) || '.' || quote_ident(i.indexname))::regclass)
ORDER BY i.indexname

-- name: pg_table_indexes
-- PostgreSQL: every index of a table
SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ?

-- name: pg_not_null_constraints
-- PostgreSQL 18: a table's NOT NULL constraints whose names start with a prefix
SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(?)
AND contype = 'n' AND starts_with(conname, ?)

-- name: pg_set_lock_timeout
-- PostgreSQL: lock_timeout for the rest of the transaction (a duration text, '0' for none)
SELECT set_config('lock_timeout', ?, true)

-- name: pg_deadlock_timeout
SELECT setting::int AS ms FROM pg_settings WHERE name = 'deadlock_timeout'

-- name: pg_columns
SELECT column_name AS name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position

-- name: sqlite_columns
SELECT name FROM pragma_table_info(?)

-- verify (ledger/projections/verify.py) -----------------------------------------

-- name: pg_repeatable_read
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ

-- name: savepoint
SAVEPOINT lg_verify_batch

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT lg_verify_batch

-- name: release_savepoint
RELEASE SAVEPOINT lg_verify_batch

-- name: logged_webhook_changes
-- verify: the webhook change rows written from an event (ledger/core/webhook_events.py)
SELECT * FROM lg_webhook_changes WHERE position IS NOT NULL ORDER BY position

-- name: meta_value
SELECT value FROM ledger_meta WHERE key = ?

-- name: stream_rows_first
-- every event up to a position with its recorded hash, in (stream, version) order
SELECT e.{position} AS position, e.originator_id AS oid, e.originator_version AS version,
  e.topic, e.state, e.hash AS hash FROM {events} e
WHERE e.{position} <= ? ORDER BY e.originator_id, e.originator_version LIMIT ?

-- name: stream_rows_after
SELECT e.{position} AS position, e.originator_id AS oid, e.originator_version AS version,
  e.topic, e.state, e.hash AS hash FROM {events} e
WHERE e.{position} <= ? AND (e.originator_id, e.originator_version) > (?, ?)
ORDER BY e.originator_id, e.originator_version LIMIT ?

-- name: read_logged
-- rebuild and verify: a page of stored events with the transition columns their rows hold
-- (ledger/projections/logged.py), in one read
SELECT {position} AS position, originator_id, originator_version, topic, state, run_id,
item_id, command, from_state, to_state, actor_id, role, at
FROM {events} WHERE {position} > ? ORDER BY {position} LIMIT ?

-- name: set_logged_transition
-- rebuild: an event's transition columns as its event says (the last is its position)
UPDATE {events} SET run_id = ?, item_id = ?, command = ?, from_state = ?, to_state = ?,
actor_id = ?, role = ?, at = ? WHERE {position} = ?
