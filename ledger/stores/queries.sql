-- The stores' own statements (ledger/stores/named.py: `?` for every value, `{slot}`s
-- filled from the store's dialect and the rule tables; identifiers chosen at run time
-- are quoted by the dialect). Blocks used by one store only say so.

-- schema ---------------------------------------------------------------------

-- name: create_meta
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)

-- name: schema_version
SELECT value FROM ledger_meta WHERE key = 'schema_version'

-- name: record_schema_version
INSERT INTO ledger_meta (key, value) VALUES ('schema_version', ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value

-- name: meta_table_present
-- PostgreSQL: whether ledger_meta exists (a database no ledger has opened has none)
SELECT to_regclass('ledger_meta') IS NOT NULL AS present

-- name: schema_lock
-- PostgreSQL: one process at a time creates or migrates the schema
SELECT pg_advisory_xact_lock(?)

-- name: items_statistics
-- PostgreSQL: the rows the planner's statistics know in the items table (-1: never
-- analyzed)
SELECT reltuples AS reltuples FROM pg_class WHERE oid = CAST('lg_items' AS regclass)

-- name: analyze_items
-- PostgreSQL: refresh them after a bulk insert; a table another ANALYZE or VACUUM
-- holds is passed over
ANALYZE (SKIP_LOCKED) lg_items

-- transactions and the clock -------------------------------------------------

-- name: begin_write
BEGIN IMMEDIATE

-- name: begin_read
BEGIN

-- name: db_now
-- PostgreSQL: the database clock (leases are judged by it)
SELECT clock_timestamp() AS now

-- name: select_run
SELECT *{now_column} FROM lg_runs WHERE run_id = ?

-- name: select_run_locked
SELECT *{now_column} FROM lg_runs WHERE run_id = ? {lock}

-- name: run_lock_update
-- PostgreSQL, a run command's lock (ledger/stores/pg_tx.py): the exclusive advisory lock
-- on the run (class 511620246: crc32(b"run-ledger run lock") & 0x7FFFFFFF, checked
-- against RUN_LOCK_CLASS at import), then the row FOR UPDATE, the clock read once both
-- are held.
WITH k AS MATERIALIZED (SELECT ?::text AS run_id),
a AS MATERIALIZED (SELECT pg_advisory_xact_lock(511620246, hashtext((SELECT run_id FROM k)))),
locked AS MATERIALIZED (SELECT * FROM lg_runs WHERE run_id = (SELECT run_id FROM k)
  AND EXISTS (SELECT 1 FROM a) FOR UPDATE)
SELECT *, clock_timestamp() AS db_now FROM locked

-- name: run_lock_item
-- PostgreSQL, an item command's run lock (ledger/stores/pg_tx.py): the shared advisory
-- lock on the run, then the row FOR SHARE, or FOR UPDATE when the run is draining.
WITH k AS MATERIALIZED (SELECT ?::text AS run_id),
a AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(511620246, hashtext((SELECT run_id FROM k)))),
seen AS MATERIALIZED (SELECT state IN ({s_pausing}, {s_canceling}) AS draining
  FROM lg_runs WHERE run_id = (SELECT run_id FROM k) AND EXISTS (SELECT 1 FROM a)),
shared AS MATERIALIZED (SELECT * FROM lg_runs WHERE run_id = (SELECT run_id FROM k)
  AND NOT COALESCE((SELECT draining FROM seen), false) FOR SHARE),
held AS MATERIALIZED (SELECT * FROM lg_runs WHERE run_id = (SELECT run_id FROM k)
  AND COALESCE((SELECT draining FROM seen), false) FOR UPDATE)
SELECT *, 'share' AS lock_mode, clock_timestamp() AS db_now FROM shared
UNION ALL SELECT *, 'update' AS lock_mode, clock_timestamp() AS db_now FROM held

-- the events table -------------------------------------------------------------

-- name: read_stored
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE {position} > ? ORDER BY {position} LIMIT ?

-- name: read_stored_upto
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE {position} > ? AND {position} <= ? ORDER BY {position} LIMIT ?

-- name: insert_event
-- SQLite: the recorder's insert of one event without a hash (`table`: its events table)
INSERT INTO {table} (originator_id, originator_version, topic, state) VALUES (?,?,?,?)

-- name: insert_event_hashed
-- SQLite: the recorder's insert of one event with its hash and its transition columns
-- (`table`: its events table; ledger/core/recorded.py)
INSERT INTO {table} (originator_id, originator_version, topic, state, hash,
run_id, item_id, command, from_state, to_state, actor_id, role, at)
VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)

-- name: fetch_hashes
-- the hashes of some streams' events in a version range (the primary key: an index search)
SELECT originator_id, originator_version, hash FROM {events}
WHERE originator_id {in_list} AND originator_version BETWEEN ? AND ? AND hash IS NOT NULL

-- raw events (ledger/stores/raw.py) -------------------------------------------

-- name: max_position
SELECT COALESCE(MAX({position}), 0) AS p FROM {events}

-- name: read_raw
SELECT e.{position} AS position, e.originator_id AS oid, e.originator_version AS version,
  e.topic, e.state, e.hash AS hash
FROM {events} e WHERE e.{position} > ? ORDER BY e.{position} LIMIT ?

-- name: read_raw_upto
SELECT e.{position} AS position, e.originator_id AS oid, e.originator_version AS version,
  e.topic, e.state, e.hash AS hash
FROM {events} e WHERE e.{position} > ? AND e.{position} <= ? ORDER BY e.{position} LIMIT ?

-- name: next_position
SELECT MIN({position}) AS p FROM {events} WHERE {position} > ? AND {position} <= ?

-- name: read_stream_events
SELECT e.{position} AS position, e.originator_version AS version, e.topic, e.state,
  e.hash AS hash
FROM {events} e WHERE e.originator_id = ? AND e.originator_version >= ?
ORDER BY e.originator_version

-- name: stream_event_at
SELECT e.{position} AS position, e.originator_version AS version, e.topic, e.state,
  e.hash AS hash
FROM {events} e WHERE e.originator_id = ? AND e.originator_version = ?

-- name: last_event
SELECT {position} AS position, originator_version AS version, topic, state
FROM {events} WHERE originator_id = ? ORDER BY originator_version DESC LIMIT 1

-- name: stream_heads
SELECT e.originator_id AS oid, e.originator_version AS version, e.hash AS hash
FROM {events} e WHERE e.originator_id {in_list}
AND e.originator_version = (SELECT MAX(m.originator_version) FROM {events} m
  WHERE m.originator_id = e.originator_id)

-- name: stream_heads_pg
-- PostgreSQL, `stream_heads` as one backward index search per stream, each stopping at
-- its first key (ledger/stores/hashchain.py `heads_statement`: 0.56 ms for 100 item
-- streams against 0.85 ms for the MAX subquery, warm, on the bench machine)
SELECT s.oid, e.originator_version AS version, e.hash AS hash
FROM unnest(?::uuid[]) AS s(oid) CROSS JOIN LATERAL (
  SELECT originator_version, hash FROM {events} WHERE originator_id = s.oid
  ORDER BY originator_version DESC LIMIT 1) AS e

-- name: stored_hash
SELECT hash FROM {events} WHERE originator_id = ? AND originator_version = ?

-- name: insert_raw_at
-- SQLite: events at the positions they carry, with their hashes
INSERT INTO {events} (rowid, originator_id, originator_version, topic, state, hash,
run_id, item_id, command, from_state, to_state, actor_id, role, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: pg_insert_raw_at
-- PostgreSQL: events at given positions, one array per column sent in binary
INSERT INTO {events} (notification_id, originator_id, originator_version, topic, state, hash,
run_id, item_id, command, from_state, to_state, actor_id, role, at)
SELECT * FROM unnest(%b::bigint[], %b::uuid[], %b::bigint[], %b::text[], %b::bytea[], %b::text[],
%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[])

-- name: pg_sequence_drawn
-- PostgreSQL: what the events table's sequence (`seq`) has drawn
SELECT last_value AS v, is_called AS c FROM {seq}

-- name: pg_reserve_positions
SELECT ledger_reserve_positions(?) AS f

-- name: count_stream_events
SELECT COUNT(*) AS n FROM {events}
WHERE originator_id {in_list} AND originator_version <= ? AND originator_version >= ?

-- name: delete_stream_events
DELETE FROM {events}
WHERE originator_id {in_list} AND originator_version <= ? AND originator_version >= ?

-- name: occupied_positions
SELECT 1 AS x FROM {events} WHERE {position} {in_list} LIMIT 1

-- PostgreSQL's catalog (ledger/stores/pg_rows.py) -----------------------------

-- name: pg_column_types
SELECT c.relname AS tab, a.attname AS col, format_type(a.atttypid, a.atttypmod) AS typ
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE a.attrelid = ANY(CAST(? AS regclass[])) AND a.attnum > 0 AND NOT a.attisdropped

-- the Merkle tree's leaves (ledger/stores/leaves.py): each event's recorded hash, and what
-- an event without one is hashed from
-- name: tree_new_leaves
-- the events to add to the tree, in position order: their chain hashes only
SELECT e.{position}, e.hash
FROM {events} e WHERE e.{position} > ? AND e.{position} <= ? ORDER BY e.{position} LIMIT ?

-- name: tree_unchained_events
-- what the leaf of an event without a chain hash is made of (unchained_leaf in leaves.py)
SELECT e.{position}, e.originator_id, e.originator_version, e.topic, e.state
FROM {events} e WHERE e.{position} {in_list}

-- name: merkle_leaves
SELECT e.{position} AS position, e.originator_id AS oid, e.originator_version AS version,
  e.topic, e.hash AS hash, CASE WHEN e.hash IS NULL THEN e.state END AS state
FROM {events} e WHERE e.{position} > ? AND e.{position} <= ? ORDER BY e.{position} LIMIT ?

-- the stored Merkle tree (ledger/stores/tree.py): one row per leaf (its event's position,
-- its data, whether the ledger itself removed the event) and one per perfect subtree
-- above the leaves, keyed by level * 2^48 + index

-- name: tree_last_leaf
SELECT leaf_index, position FROM lg_merkle_leaves ORDER BY leaf_index DESC LIMIT 1

-- name: tree_leaves_at
SELECT leaf_index, data FROM lg_merkle_leaves WHERE leaf_index {in_list}

-- name: tree_nodes_at
SELECT node, hash FROM lg_merkle_nodes WHERE node {in_list}

-- name: tree_leaves_by_position
SELECT leaf_index, position, data, gone FROM lg_merkle_leaves WHERE position {in_list}

-- name: tree_leaves_with_events
-- the leaves from an index on, each with its event where the events table still holds it
SELECT l.leaf_index, l.position, l.data, l.gone, e.originator_id AS oid,
  e.originator_version AS version, e.topic, e.hash AS hash,
  CASE WHEN e.hash IS NULL THEN e.state END AS state,
  CASE WHEN e.{position} IS NULL THEN 0 ELSE 1 END AS present
FROM lg_merkle_leaves l LEFT JOIN {events} e ON e.{position} = l.position
WHERE l.leaf_index >= ? AND l.leaf_index < ? ORDER BY l.leaf_index

-- name: tree_mark_gone
-- the leaves of events the ledger deletes (archive, restore): the leaves stay
UPDATE lg_merkle_leaves SET gone = 1 WHERE position IN (
  SELECT {position} FROM {events}
  WHERE originator_id {in_list} AND originator_version <= ? AND originator_version >= ?)

-- name: tree_mark_back
UPDATE lg_merkle_leaves SET gone = 0 WHERE position {in_list}

-- name: tree_lock
-- PostgreSQL: one transaction at a time extends the tree
SELECT pg_advisory_xact_lock(?)

-- name: tree_unleafed
SELECT COUNT(*) AS n FROM {events}
WHERE originator_id {in_list} AND originator_version <= ? AND originator_version >= ?
  AND {position} > ?

-- name: pg_tree_insert_leaves
-- PostgreSQL: a page of leaves in one statement: the first leaf index, the positions as
-- comma-separated text and the data as one bytea of 32 bytes per leaf (arrays of bytea
-- cost the client a quoting pass per element)
INSERT INTO lg_merkle_leaves (leaf_index, position, data)
SELECT ?::bigint + t.n - 1, t.p, substring(?::bytea FROM ((t.n - 1) * 32 + 1)::int FOR 32)
FROM unnest(string_to_array(?::text, ',')::bigint[]) WITH ORDINALITY AS t(p, n)

-- name: sqlite_tree_insert_leaves
-- SQLite: the same, the positions as a JSON array
INSERT INTO lg_merkle_leaves (leaf_index, position, data)
SELECT ? + key, value, substr(?, key * 32 + 1, 32) FROM json_each(?)

-- name: sqlite_tree_insert_nodes
INSERT INTO lg_merkle_nodes (node, hash) SELECT value, substr(?, key * 32 + 1, 32) FROM json_each(?)

-- name: pg_tree_insert_nodes
-- the same for a page of nodes: their keys as text, their hashes as one bytea
INSERT INTO lg_merkle_nodes (node, hash)
SELECT t.k, substring(?::bytea FROM ((t.n - 1) * 32 + 1)::int FOR 32)
FROM unnest(string_to_array(?::text, ',')::bigint[]) WITH ORDINALITY AS t(k, n)
