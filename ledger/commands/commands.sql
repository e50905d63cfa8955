-- The statements of the command handlers (ledger/commands/), by name; read through
-- ledger/commands/sql.py. Slots in braces are filled from the store's dialect and the
-- rule tables (ledger/stores/named.py).

-- ---------------------------------------------------------------------------
-- leases.py: the items a claim may lease
-- ---------------------------------------------------------------------------

-- name: claimable_pending
-- past the run's item deadline only pending items are leased; PostgreSQL passes over
-- the rows another claim holds (its share lock on the run lets claims run side by side;
-- rule 3: one live lease per item)
SELECT * FROM lg_items WHERE run_id = ? AND state = {s_pending}
ORDER BY seq LIMIT ? {claim_lock};

-- name: claimable_pending postgres
-- the state as a range and the order by state, then seq: only lg_items_state (run_id,
-- state, seq) gives that order, so each claim reads the pending items it takes and no
-- others. With `state = ...` the planner drops the state from the order, and from
-- statistics taken while the run was all pending it walks the run in seq order
-- (lg_items_seq), passing over every item done so far, on every claim.
SELECT * FROM lg_items WHERE run_id = ? AND state >= {s_pending} AND state <= {s_pending}
ORDER BY state, seq LIMIT ? {claim_lock};

-- name: claimable
-- two index range scans (run_id, state, seq) instead of one scan over every item of the
-- run: an OR across states defeats the index on both stores. A retryable item is due at
-- its eligible_at, or at once when that lies further ahead than the run's backoff: it was
-- scheduled by a clock that has since stepped back (leases.claim)
SELECT * FROM (SELECT * FROM (SELECT * FROM lg_items WHERE run_id = ?
AND state = {s_pending} ORDER BY seq LIMIT ? {claim_lock}) AS p UNION ALL SELECT * FROM
(SELECT * FROM lg_items WHERE run_id = ? AND state = {s_retryable} AND
(eligible_at IS NULL OR eligible_at <= ? OR eligible_at > ?) ORDER BY seq LIMIT ?
{claim_lock}) AS r) AS c ORDER BY seq LIMIT ?;

-- name: claimable postgres
-- as `claimable_pending postgres`: each state as a range, each scan in (state, seq) order
SELECT * FROM (SELECT * FROM (SELECT * FROM lg_items WHERE run_id = ?
AND state >= {s_pending} AND state <= {s_pending} ORDER BY state, seq LIMIT ? {claim_lock})
AS p UNION ALL SELECT * FROM (SELECT * FROM lg_items WHERE run_id = ?
AND state >= {s_retryable} AND state <= {s_retryable} AND
(eligible_at IS NULL OR eligible_at <= ? OR eligible_at > ?) ORDER BY state, seq LIMIT ?
{claim_lock}) AS r) AS c ORDER BY seq LIMIT ?;

-- name: items_by_id_locked
-- the named items of a run (the ids: one list parameter), locked for the transaction
-- (PostgreSQL) in item id order: two such transactions never deadlock (unlocked, they
-- are the projections' `load_items`)
SELECT * FROM lg_items WHERE run_id = ? AND item_id {in_list} ORDER BY item_id {lock};

-- name: items_by_id_locked postgres
-- one search of the primary key per id, whatever the planner's statistics say of the
-- run. Planned from them, the common block's `item_id = ANY` reads every row of a run
-- newer than the table's last ANALYZE (as a run being worked mostly is), on every
-- call; with the run id a constant in the plan, so does a search per id. Read from a
-- materialized CTE, the run id is a value the planner cannot see. Each row is locked
-- as it is found, in item id order.
WITH p AS MATERIALIZED (SELECT CAST(? AS text) AS run_id, CAST(? AS text[]) AS ids)
SELECT i.* FROM p
CROSS JOIN LATERAL (SELECT DISTINCT u.item_id FROM unnest(p.ids) AS u (item_id)
ORDER BY u.item_id) AS n
CROSS JOIN LATERAL (SELECT * FROM lg_items AS t WHERE t.run_id = p.run_id
AND t.item_id = n.item_id {lock}) AS i ORDER BY i.item_id;

-- name: run_amended_by
SELECT position FROM lg_transitions WHERE run_id = ? AND item_id IS NULL
AND command IN ('amend', 'weaken_acceptance') AND actor_id = ? LIMIT 1;

-- name: runs_with_expired_leases
SELECT DISTINCT run_id FROM lg_items WHERE state = {s_in_progress} AND
lease_expires_at < ?;

-- name: runs_to_reconcile
SELECT run_id FROM lg_runs WHERE state IN
({s_running}, {s_awaiting_review}, {s_pausing}, {s_paused}, {s_canceling});

-- name: expired_leases_of_run
-- expired, or set to expire further ahead than one lease: granted by a clock that has
-- since stepped back (reconcile.reconcile_run)
SELECT * FROM lg_items WHERE run_id = ? AND state = {s_in_progress} AND
(lease_expires_at < ? OR lease_expires_at > ?) ORDER BY seq;

-- name: retryable_items
SELECT * FROM lg_items WHERE run_id = ? AND state = {s_retryable} ORDER BY seq;

-- name: idempotency_page
SELECT idempotency_key, recorded_at FROM ledger_idempotency WHERE idempotency_key > ?
ORDER BY idempotency_key LIMIT ?;

-- name: idempotency_forget
DELETE FROM ledger_idempotency WHERE idempotency_key = ?;

-- name: idempotency_lookup
SELECT command, fingerprint, response FROM ledger_idempotency WHERE idempotency_key = ?;

-- name: idempotency_record
-- RETURNING, not rowcount: the answer is read back even when statements are pipelined
INSERT INTO ledger_idempotency (idempotency_key, command, fingerprint, run_id, response,
recorded_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: manifest_items_not_accepted
SELECT item_id, state, required, reason FROM lg_items WHERE run_id = ?
AND in_manifest = 1 AND state <> {s_accepted} ORDER BY seq;

-- name: required_items_counted
SELECT COUNT(*) AS n FROM lg_items WHERE run_id = ? AND
in_manifest = 1 AND required = 1;

-- name: leased_items
SELECT * FROM lg_items WHERE run_id = ? AND state = {s_in_progress} ORDER BY seq;

-- name: cancel_reason
-- the reason is in the event's state (ledger/core/recorded.py)
SELECT topic, state FROM lg_transitions WHERE run_id = ? AND item_id IS NULL
AND command = 'cancel' ORDER BY position DESC LIMIT 1;

-- name: waiting_items
SELECT * FROM lg_items WHERE run_id = ? AND state IN ({s_pending}, {s_retryable})
ORDER BY seq;

-- name: manifest
SELECT item_id, required, payload FROM lg_items WHERE run_id = ? AND in_manifest = 1
ORDER BY seq;

-- name: manifest_not_accepted
SELECT item_id, required, payload FROM lg_items WHERE run_id = ? AND in_manifest = 1
AND state <> {s_accepted} ORDER BY seq;

-- name: manifest_accepted
SELECT item_id, required, payload FROM lg_items WHERE run_id = ? AND in_manifest = 1
AND state = {s_accepted} ORDER BY seq;

-- name: open_runs_of_root
SELECT run_id, state, links FROM lg_runs WHERE root_run_id = ?
AND state NOT IN ({terminal_run_states}) ORDER BY seq;

-- name: item_ids
SELECT item_id FROM lg_items WHERE run_id = ?;

-- name: required_item_ids
SELECT item_id FROM lg_items WHERE run_id = ? AND required = 1;

-- name: items_to_amend
SELECT item_id, required, payload, state, in_manifest, revision, attempts,
lease_token, lease_worker, lease_expires_at, eligible_at, last_error, reason,
updated_at, lease_started_at, run_id FROM lg_items WHERE run_id = ? ORDER BY seq;

-- name: run_retried
SELECT attempt FROM lg_attempts WHERE run_id = ?
AND outcome IN ('failed', 'lease_expired') LIMIT 1;
