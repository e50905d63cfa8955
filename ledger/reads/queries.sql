-- The statements of the reads (ledger/reads/), by name; read through ledger/reads/sql.py.
-- A question mark marks every value; the slots in braces are filled from the store's dialect and the rule
-- tables (ledger/stores/named.py).

-- ---------------------------------------------------------------------------
-- queries.py: runs and items
-- ---------------------------------------------------------------------------

-- name: run
SELECT * FROM lg_runs WHERE run_id = ?;

-- name: item
SELECT * FROM lg_items WHERE run_id = ? AND item_id = ?;

-- name: run_ids_in_range
-- run ids from the first bound up to the second: a prefix and the prefix followed by "~",
-- which sorts after every character of a run id (an index range, no pattern to escape)
SELECT run_id FROM lg_runs WHERE run_id >= ? AND run_id < ? ORDER BY run_id LIMIT ?;

-- name: item_locked
-- the item's row locked for the transaction (PostgreSQL)
SELECT * FROM lg_items WHERE run_id = ? AND item_id = ? {lock};

-- name: not_accepted_items
-- The run's first 20 items not accepted. `seq + 0`: ordered by an expression, SQLite
-- reads the few items in those states on the (run_id, state, seq) index and sorts them,
-- instead of walking every item of the run in seq order on (run_id, seq) until it has
-- found 20 (or none).
SELECT item_id, state, required, reason FROM lg_items
WHERE run_id = ? AND state IN ({not_accepted_finals})
ORDER BY seq + 0 LIMIT 20;

-- name: runs_newest
SELECT * FROM lg_runs ORDER BY seq DESC LIMIT ?;

-- name: runs_newest_in_state
SELECT * FROM lg_runs WHERE state = ? ORDER BY seq DESC LIMIT ?;

-- name: runs_of_root
SELECT * FROM lg_runs WHERE root_run_id = ? ORDER BY seq;

-- name: audit_run_asc
-- audit, oldest first: the run's transitions (the log's run index)
SELECT * FROM lg_transitions
WHERE run_id = ?
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_run_desc
-- audit, newest first: the run's transitions (the log's run index)
SELECT * FROM lg_transitions
WHERE run_id = ?
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_actor_asc
-- audit, oldest first: one actor's (the log's actor index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND actor_id = ?
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_actor_desc
-- audit, newest first: one actor's (the log's actor index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND actor_id = ?
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_state_asc
-- audit, oldest first: PostgreSQL, a target state other than in_progress and accepted: the log's partial state index, its predicate written out so a generic plan uses it too
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND to_state = ? AND to_state NOT IN ({s_in_progress}, {s_accepted})
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_state_desc
-- audit, newest first: PostgreSQL, a target state other than in_progress and accepted: the log's partial state index, its predicate written out so a generic plan uses it too
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND to_state = ? AND to_state NOT IN ({s_in_progress}, {s_accepted})
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_state_any_asc
-- audit, oldest first: SQLite, any target state (the log's state index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND to_state = ?
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_state_any_desc
-- audit, newest first: SQLite, any target state (the log's state index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND to_state = ?
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_role_asc
-- audit, oldest first: PostgreSQL, a role other than worker: the log's partial role index, its predicate written out
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND role = ? AND role <> {r_worker}
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_role_desc
-- audit, newest first: PostgreSQL, a role other than worker: the log's partial role index, its predicate written out
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND role = ? AND role <> {r_worker}
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_role_any_asc
-- audit, oldest first: SQLite, any role (the log's role index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND role = ?
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_role_any_desc
-- audit, newest first: SQLite, any role (the log's role index)
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND role = ?
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_at_asc
-- audit, oldest first: a time range only (since: '' when not given)
SELECT * FROM lg_transitions
WHERE at >= ?
  AND at <= ?
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_at_desc
-- audit, newest first: a time range only (since: '' when not given)
SELECT * FROM lg_transitions
WHERE at >= ?
  AND at <= ?
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_at_sorted_asc
-- audit, oldest first: a time range only, SQLite: ordered by `+position`, SQLite (no statistics on `at`) searches the log's at index and sorts instead of scanning every row in position order; `+position` in the bounds too, so that the position range (the rowid) does not lead instead
SELECT * FROM lg_transitions
WHERE at >= ?
  AND at <= ?
  AND +position > ?
  AND +position <= ?
ORDER BY +position ASC LIMIT ?;

-- name: audit_at_sorted_desc
-- audit, newest first: a time range only, SQLite: ordered by `+position`, SQLite (no statistics on `at`) searches the log's at index and sorts instead of scanning every row in position order; `+position` in the bounds too, so that the position range (the rowid) does not lead instead
SELECT * FROM lg_transitions
WHERE at >= ?
  AND at <= ?
  AND +position < ?
  AND +position <= ?
ORDER BY +position DESC LIMIT ?;

-- name: audit_since_asc
-- audit, oldest first: from a time on only
SELECT * FROM lg_transitions
WHERE at >= ?
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_since_desc
-- audit, newest first: from a time on only
SELECT * FROM lg_transitions
WHERE at >= ?
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_since_sorted_asc
-- audit, oldest first: from a time on only, SQLite (see audit_at_sorted)
SELECT * FROM lg_transitions
WHERE at >= ?
  AND +position > ?
  AND +position <= ?
ORDER BY +position ASC LIMIT ?;

-- name: audit_since_sorted_desc
-- audit, newest first: from a time on only, SQLite (see audit_at_sorted)
SELECT * FROM lg_transitions
WHERE at >= ?
  AND +position < ?
  AND +position <= ?
ORDER BY +position DESC LIMIT ?;

-- name: audit_webhooks_asc
-- audit, oldest first: the webhook changes recorded in the event log (those with a position)
SELECT * FROM lg_webhook_changes
WHERE position IS NOT NULL
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_webhooks_desc
-- audit, newest first: the webhook changes recorded in the event log (those with a position)
SELECT * FROM lg_webhook_changes
WHERE position IS NOT NULL
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: audit_all_asc
-- audit, oldest first: any other filter (each checked per row), or none: in position order
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position > ?
  AND position <= ?
ORDER BY position ASC LIMIT ?;

-- name: audit_all_desc
-- audit, newest first: any other filter (each checked per row), or none: in position order
SELECT * FROM lg_transitions
WHERE (CAST(? AS TEXT) IS NULL OR run_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR actor_id = ?)
  AND (CAST(? AS TEXT) IS NULL OR role = ?)
  AND (CAST(? AS TEXT) IS NULL OR to_state = ?)
  AND (CAST(? AS TEXT) IS NULL OR at >= ?)
  AND (CAST(? AS TEXT) IS NULL OR at <= ?)
  AND position < ?
  AND position <= ?
ORDER BY position DESC LIMIT ?;

-- name: item_seq
SELECT seq FROM lg_items WHERE run_id = ? AND item_id = ?;

-- name: items_page
SELECT * FROM lg_items WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?;

-- name: items_page_in_state
SELECT * FROM lg_items WHERE run_id = ? AND state = ? AND seq > ? ORDER BY seq LIMIT ?;

-- A run's attempts: the ended ones are rows of lg_attempts (written when each ended),
-- the open one of an item in progress is its lease on the item row (started at
-- lease_started_at, not finished). Each read below adds the open ones to the rows, in
-- the columns of lg_attempts, found by start time on lg_items_leased (a page of them
-- costs a page, however many items are in progress).

-- name: attempt_key
SELECT a.started_at, i.seq FROM lg_attempts a JOIN lg_items i ON
a.run_id = i.run_id AND a.item_id = i.item_id
WHERE a.run_id = ? AND a.item_id = ? AND a.attempt = ?
UNION ALL SELECT lease_started_at, seq FROM lg_items WHERE run_id = ? AND item_id = ?
AND state = {s_in_progress} AND attempts = ?;

-- name: item_attempts_page
SELECT * FROM (SELECT run_id, item_id, attempt, worker_id, lease_token, started_at,
expires_at, finished_at, stage, outcome, error FROM lg_attempts
WHERE run_id = ? AND item_id = ? AND attempt > ?
UNION ALL SELECT run_id, item_id, attempts, lease_worker, lease_token, lease_started_at,
lease_expires_at, NULL, NULL, NULL, NULL FROM lg_items
WHERE run_id = ? AND item_id = ? AND state = {s_in_progress} AND attempts > ?) t
ORDER BY attempt LIMIT ?;

-- name: run_attempts_page_end
-- the page ends at or before the n-th start time after the cursor's: found on the index
-- alone, it bounds the join and sort to about one page (else PostgreSQL hashes the whole
-- run's items for every page)
SELECT started_at FROM (SELECT * FROM (SELECT started_at FROM lg_attempts
WHERE run_id = ? AND started_at > ? ORDER BY started_at LIMIT ?) e
UNION ALL SELECT * FROM (SELECT lease_started_at FROM lg_items WHERE run_id = ?
AND state = {s_in_progress} AND lease_started_at > ? ORDER BY lease_started_at LIMIT ?) o)
t ORDER BY started_at LIMIT 1 OFFSET ?;

-- name: run_attempts_page
-- the run's attempts ordered by (started_at, item seq, attempt): the range on started_at
-- uses lg_attempts_started, the rest of the key is compared after the join
SELECT * FROM (SELECT * FROM (SELECT a.run_id, a.item_id, a.attempt, a.worker_id,
a.lease_token, a.started_at, a.expires_at, a.finished_at, a.stage, a.outcome, a.error,
i.seq AS item_seq FROM lg_attempts a JOIN lg_items i ON a.run_id = i.run_id
AND a.item_id = i.item_id WHERE a.run_id = ? AND a.started_at >= ? AND (a.started_at > ?
OR i.seq > ? OR (i.seq = ? AND a.attempt > ?)) ORDER BY a.started_at, i.seq, a.attempt
LIMIT ?) e
UNION ALL SELECT * FROM (SELECT run_id, item_id, attempts, lease_worker, lease_token,
lease_started_at, lease_expires_at, NULL, NULL, NULL, NULL, seq FROM lg_items
WHERE run_id = ? AND state = {s_in_progress} AND lease_started_at >= ?
AND (lease_started_at > ? OR seq > ? OR (seq = ? AND attempts > ?))
ORDER BY lease_started_at, seq, attempts LIMIT ?) o) t
ORDER BY started_at, item_seq, attempt LIMIT ?;

-- name: run_attempts_page_upto
SELECT * FROM (SELECT * FROM (SELECT a.run_id, a.item_id, a.attempt, a.worker_id,
a.lease_token, a.started_at, a.expires_at, a.finished_at, a.stage, a.outcome, a.error,
i.seq AS item_seq FROM lg_attempts a JOIN lg_items i ON a.run_id = i.run_id
AND a.item_id = i.item_id WHERE a.run_id = ? AND a.started_at >= ? AND a.started_at <= ?
AND (a.started_at > ? OR i.seq > ? OR (i.seq = ? AND a.attempt > ?))
ORDER BY a.started_at, i.seq, a.attempt LIMIT ?) e
UNION ALL SELECT * FROM (SELECT run_id, item_id, attempts, lease_worker, lease_token,
lease_started_at, lease_expires_at, NULL, NULL, NULL, NULL, seq FROM lg_items
WHERE run_id = ? AND state = {s_in_progress} AND lease_started_at >= ?
AND lease_started_at <= ? AND (lease_started_at > ? OR seq > ? OR (seq = ? AND attempts > ?))
ORDER BY lease_started_at, seq, attempts LIMIT ?) o) t
ORDER BY started_at, item_seq, attempt LIMIT ?;

-- name: history_page
SELECT * FROM lg_transitions WHERE run_id = ? ORDER BY position LIMIT ?;

-- name: history_page_after
SELECT * FROM lg_transitions WHERE run_id = ? AND position > ? ORDER BY position LIMIT ?;

-- name: history_page_upto
SELECT * FROM lg_transitions WHERE run_id = ? AND position <= ? ORDER BY position LIMIT ?;

-- name: history_page_after_upto
SELECT * FROM lg_transitions WHERE run_id = ? AND position > ? AND position <= ?
ORDER BY position LIMIT ?;

-- name: board_in_state
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state = ? ORDER BY seq DESC LIMIT ?;

-- name: board_in_state_before
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state = ? AND seq < ? ORDER BY seq DESC LIMIT ?;

-- name: board_open
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state IN ({open_run_states}) ORDER BY seq DESC LIMIT ?;

-- name: board_open_before
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state IN ({open_run_states}) AND seq < ? ORDER BY seq DESC LIMIT ?;

-- name: board_terminal
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state IN ({terminal_run_states}) ORDER BY seq DESC LIMIT ?;

-- name: board_terminal_before
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE state IN ({terminal_run_states}) AND seq < ? ORDER BY seq DESC LIMIT ?;

-- name: board_run
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, started_at,
stopped_at, stop_reason, scope, summary, failure_kind, failure_reason,
cancel_requested, links, item_count
FROM lg_runs WHERE run_id = ?;

-- name: run_items_page
SELECT item_id, seq, state, required, attempts, lease_worker, lease_expires_at,
reason, last_error, updated_at FROM lg_items WHERE run_id = ? ORDER BY seq LIMIT ?;

-- name: run_items_page_after
SELECT item_id, seq, state, required, attempts, lease_worker, lease_expires_at,
reason, last_error, updated_at FROM lg_items WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?;

-- name: run_items_page_in_state
SELECT item_id, seq, state, required, attempts, lease_worker, lease_expires_at,
reason, last_error, updated_at FROM lg_items WHERE run_id = ? AND state = ?
ORDER BY seq LIMIT ?;

-- name: run_items_page_in_state_after
SELECT item_id, seq, state, required, attempts, lease_worker, lease_expires_at,
reason, last_error, updated_at FROM lg_items WHERE run_id = ? AND state = ? AND seq > ?
ORDER BY seq LIMIT ?;

-- name: run_attempts_counted
-- ordered by the index's own order, so the planner reads the run's index entries, never
-- a table scan that may pass other runs' attempts first; the open attempts added
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM lg_attempts WHERE run_id = ?
ORDER BY started_at LIMIT ?) t) + (SELECT COUNT(*) FROM (SELECT 1 FROM lg_items
WHERE run_id = ? AND state = {s_in_progress} ORDER BY lease_started_at LIMIT ?) o) AS n;

-- name: run_attempts_newest
SELECT * FROM (SELECT * FROM (SELECT item_id, attempt, worker_id, started_at, expires_at,
finished_at, stage, outcome, error FROM lg_attempts WHERE run_id = ?
ORDER BY started_at DESC, item_id DESC, attempt DESC LIMIT ?) e
UNION ALL SELECT * FROM (SELECT item_id, attempts, lease_worker, lease_started_at,
lease_expires_at, NULL, NULL, NULL, NULL FROM lg_items WHERE run_id = ?
AND state = {s_in_progress} ORDER BY lease_started_at DESC, item_id DESC, attempts DESC
LIMIT ?) o) t ORDER BY started_at DESC, item_id DESC, attempt DESC LIMIT ?;

-- name: run_attempts_newest_before
SELECT * FROM (SELECT * FROM (SELECT item_id, attempt, worker_id, started_at, expires_at,
finished_at, stage, outcome, error FROM lg_attempts WHERE run_id = ?
AND (started_at, item_id, attempt) < (?, ?, ?)
ORDER BY started_at DESC, item_id DESC, attempt DESC LIMIT ?) e
UNION ALL SELECT * FROM (SELECT item_id, attempts, lease_worker, lease_started_at,
lease_expires_at, NULL, NULL, NULL, NULL FROM lg_items WHERE run_id = ?
AND state = {s_in_progress} AND (lease_started_at, item_id, attempts) < (?, ?, ?)
ORDER BY lease_started_at DESC, item_id DESC, attempts DESC LIMIT ?) o) t
ORDER BY started_at DESC, item_id DESC, attempt DESC LIMIT ?;

-- name: open_runs_by_state
SELECT state, COUNT(*) AS n FROM lg_runs WHERE state IN ({open_run_states}) GROUP BY state;

-- name: expired_leases
-- the state as a literal: PostgreSQL's lg_items_lease holds only leased items
SELECT COUNT(*) AS n, COUNT(DISTINCT run_id) AS runs FROM lg_items
WHERE state = {s_in_progress} AND lease_expires_at < ?;

-- name: open_runs_page
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs WHERE state IN ({open_run_states}) AND seq > ? ORDER BY seq LIMIT ?;

-- name: run_signals
-- One statement for every signal but the lease holders (a round trip each cost more than
-- the reads): per run, its latest transition, its expired leases, its items finished in
-- the rate window and its required items still open. The runs: one list parameter.
--
-- The latest transition is read backwards on the (run_id, position) index, the run
-- id given as a range, not an equality: with equality PostgreSQL may walk the primary
-- key backwards from the newest position instead, filtering by run, through every
-- transition written since this run's last one (33 ms against 0.2 ms for a run with
-- 200,000 newer events of other runs; bench case 5).
--
-- Finished items count from the first position stamped inside the window (an index seek
-- on the events' `at` index), so only the run's recent transitions are read. Positions follow
-- the store's clock (one clock per store stamps every event in commit order); were that
-- clock set back, the rate would undercount, never overcount.
--
-- The latest lease expiry of the run's items in progress tells a lease granted by a clock
-- that has since stepped back (set to expire more than the run's lease_seconds ahead):
-- the lease length is the run's own, so the few runs with one are read again (stepped_leases).
SELECT r.run_id,
(SELECT t.at FROM lg_transitions t WHERE t.run_id >= r.run_id AND t.run_id <= r.run_id
ORDER BY t.run_id DESC, t.position DESC LIMIT 1) AS last_at,
(SELECT COUNT(*) FROM lg_items i WHERE i.run_id = r.run_id AND i.state = ?
AND i.lease_expires_at < ?) AS expired_n,
(SELECT MIN(i.lease_expires_at) FROM lg_items i WHERE i.run_id = r.run_id
AND i.state = ? AND i.lease_expires_at < ?) AS expired_oldest,
(SELECT MAX(i.lease_expires_at) FROM lg_items i WHERE i.run_id = r.run_id
AND i.state = ?) AS lease_latest,
(SELECT COUNT(*) FROM lg_transitions t WHERE t.run_id = r.run_id AND t.position >=
(SELECT w.position FROM lg_transitions w WHERE w.at >= ? ORDER BY w.at, w.position
LIMIT 1) AND t.item_id IS NOT NULL
AND t.to_state IN ({final_item_states}) AND t.at >= ? AND t.at <= ?) AS finished,
(SELECT COUNT(*) FROM lg_items i WHERE i.run_id = r.run_id AND i.required = 0
AND i.state IN ({s_pending}, {s_in_progress}, {s_retryable})) AS optional_open,
(SELECT COUNT(*) FROM lg_items i WHERE i.run_id = r.run_id
AND i.state IN ({s_rejected}, {s_skipped}, {s_quarantined})
AND i.required = 1 AND i.in_manifest = 1) AS lost_required
FROM lg_runs r WHERE r.run_id {in_list};

-- name: required_items_counted
SELECT COUNT(*) AS n FROM lg_items WHERE run_id = ? AND in_manifest = 1 AND required = 1;

-- name: lease_holders
SELECT DISTINCT run_id, lease_worker FROM lg_items
WHERE run_id {in_list} AND state = ? AND lease_expires_at >= ?
ORDER BY run_id, lease_worker;

-- name: stepped_leases
-- one run's leases set to expire later than the second value (the clock plus the run's
-- lease_seconds): granted before the clock stepped back, they end at the next reconcile
SELECT COUNT(*) AS n FROM lg_items WHERE run_id = ? AND state = ? AND lease_expires_at > ?;

-- name: lease_holders_of_run
-- one run's live lease holders: expiring from the first value up to the second
SELECT DISTINCT lease_worker FROM lg_items
WHERE run_id = ? AND state = ? AND lease_expires_at >= ? AND lease_expires_at <= ?
ORDER BY lease_worker;

-- name: run_and_root
SELECT run_id, root_run_id FROM lg_runs WHERE run_id = ?;

-- name: item_ids
SELECT item_id FROM lg_items WHERE run_id = ?;

-- name: linked_runs
SELECT run_id FROM lg_runs WHERE root_run_id = ? AND run_id <> ?;

-- name: stream_events
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE originator_id {in_list};

-- name: stream_first_events
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE originator_id {in_list} AND originator_version = 1;

-- name: feed_head
-- the last transition's position: the log read backwards to the first transition (a MAX
-- with the view's condition would be a whole scan on SQLite)
SELECT COALESCE((SELECT position FROM lg_transitions ORDER BY position DESC LIMIT 1), 0) AS head;

-- name: feed_head_upto
SELECT COALESCE((SELECT position FROM lg_transitions WHERE position <= ?
ORDER BY position DESC LIMIT 1), 0) AS head;

-- name: feed_page
-- the plain keyset read: its plan walks the position index whatever the statistics say
SELECT run_id, item_id, from_state, to_state, actor_id, role, topic, state, at,
revision, position, command
FROM lg_transitions WHERE position > ? ORDER BY position LIMIT ?;

-- name: feed_page_of_run
SELECT run_id, item_id, from_state, to_state, actor_id, role, topic, state, at,
revision, position, command
FROM lg_transitions WHERE position > ? AND run_id = ? ORDER BY position LIMIT ?;

-- name: feed_page_of_kinds
-- kinds: one list parameter, given twice (commands and states share it)
SELECT run_id, item_id, from_state, to_state, actor_id, role, topic, state, at,
revision, position, command
FROM lg_transitions WHERE position > ? AND (command {in_list} OR to_state {in_list})
ORDER BY position LIMIT ?;

-- name: feed_page_of_run_kinds
SELECT run_id, item_id, from_state, to_state, actor_id, role, topic, state, at,
revision, position, command
FROM lg_transitions WHERE position > ? AND run_id = ? AND (command {in_list} OR to_state {in_list})
ORDER BY position LIMIT ?;

-- name: run_exists
SELECT run_id FROM lg_runs WHERE run_id = ?;

-- name: overview_items
-- Items of open runs by state: the count rows kept with the writes hold the open runs only
-- (a run's rows move into its own row when it ends; ledger/projections/counts.py).
SELECT state, SUM(n) AS n FROM lg_run_counts GROUP BY state;

-- name: overview_expired_runs
-- the state as a literal: PostgreSQL's lg_items_lease holds only leased items
SELECT DISTINCT run_id FROM lg_items WHERE state = {s_in_progress} AND lease_expires_at < ?;

-- name: overview_latest_at
-- the time of the latest transition (the last entry of the events' `at` index): later than the
-- clock only after the clock stepped back
SELECT (SELECT at FROM lg_transitions ORDER BY at DESC LIMIT 1) AS at;

-- name: overview_leased_runs
-- runs holding a lease that expires after the given time (read only after a backward step
-- of the clock: a lease granted before it may lie further ahead than its run's length)
SELECT DISTINCT run_id FROM lg_items WHERE state = {s_in_progress} AND lease_expires_at > ?;

-- name: overview_deciding
-- Open runs whose owner is a decision or a drain whatever their items: few, and each needs
-- someone (awaiting review, paused, pausing, canceling).
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs WHERE state IN ({s_awaiting_review}, {s_paused}, {s_pausing}, {s_canceling});

-- name: overview_drained
-- Running runs with no item left to claim or finish: they wait on their controller or on
-- a reviewer (one probe of the item state index each).
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs r WHERE r.state = {s_running} AND NOT EXISTS (
SELECT 1 FROM lg_items i WHERE i.run_id = r.run_id
AND i.state IN ({s_pending}, {s_in_progress}, {s_retryable}));

-- name: overview_runs
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs WHERE run_id {in_list};

-- name: overview_oldest_queued
-- 20 entries of lg_runs_created (and of lg_runs_updated below), no sort
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs WHERE state = {s_queued} ORDER BY created_at, seq LIMIT ?;

-- name: overview_oldest_running
SELECT seq, run_id, state, counts, policy, review, created_at, updated_at, stopped_at, scope
FROM lg_runs WHERE state = {s_running} ORDER BY updated_at, seq LIMIT ?;

-- name: overview_stalled
-- Running runs quiet past the default stall threshold (the same time twice, as text) whose
-- policy sets none of its own, but the given runs (read whole already): how many (`n`, on
-- every row) and the first few by seq. A run's own row changes with each of its
-- transitions, so its last activity is no older than its updated_at: only rows older than
-- the threshold (a range of lg_runs_updated) are probed for their latest transition, all
-- inside this statement (see run_signals for why the run id is a range). The key is
-- stored only when the policy sets it; the test is lg_runs_own_stall's (overview_own_stall).
SELECT r.run_id, r.seq, COUNT(*) OVER () AS n FROM lg_runs r
WHERE r.state = {s_running} AND r.updated_at < ?
AND length(replace(r.policy, '"stall_seconds"', '')) = length(r.policy)
AND NOT (r.run_id {in_list})
AND (SELECT t.at FROM lg_transitions t WHERE t.run_id >= r.run_id AND t.run_id <= r.run_id
ORDER BY t.run_id DESC, t.position DESC LIMIT 1) < ?
ORDER BY r.seq LIMIT ?;

-- name: overview_own_stall
-- Running runs whose policy sets its own stall threshold, from the partial index
-- lg_runs_own_stall that holds those only (its condition word for word: the planner
-- matches it as written; no LIKE, whose percent signs psycopg would read).
SELECT run_id, seq, updated_at, policy FROM lg_runs
WHERE state = {s_running} AND length(replace(policy, '"stall_seconds"', '')) < length(policy);

-- name: runs_last_activity
-- each run's latest transition (see run_signals for why the run id is a range)
SELECT r.run_id,
(SELECT t.at FROM lg_transitions t WHERE t.run_id >= r.run_id AND t.run_id <= r.run_id
ORDER BY t.run_id DESC, t.position DESC LIMIT 1) AS last_at
FROM lg_runs r WHERE r.run_id {in_list};

-- name: payload_events
-- the events that set item payloads, of the given run streams, from one position to
-- before another: each run's first event (its manifest) and its amendments (by topic),
-- nothing else decoded
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE originator_id {in_list} AND {position} >= ? AND {position} < ?
AND (originator_version = 1 OR topic = ?);

-- name: payload_amendments
-- the same without the first events (the reader has them): the amendments only
SELECT {position} AS position, originator_id, originator_version, topic, state
FROM {events} WHERE originator_id {in_list} AND {position} >= ? AND {position} < ?
AND originator_version > 1 AND topic = ?;

-- ---------------------------------------------------------------------------
-- timetravel.py: the private in-memory tables a past status is read from
-- ---------------------------------------------------------------------------

-- name: memory_events
-- the replayed events' transition columns (as the SQLite store's event log holds them,
-- schema v17), for the signals' reads of lg_transitions
CREATE TABLE stored_events (originator_version INTEGER, topic TEXT, state BLOB,
run_id TEXT, item_id TEXT, command TEXT, from_state TEXT, to_state TEXT, actor_id TEXT,
role TEXT, at TEXT);

-- name: memory_transitions
CREATE VIEW lg_transitions AS SELECT rowid AS position, run_id, item_id, command,
from_state, to_state, actor_id, role, at, originator_version AS revision, topic, state
FROM stored_events WHERE run_id IS NOT NULL;

-- name: memory_insert_event
INSERT INTO stored_events (rowid, originator_version, topic, state, run_id, item_id,
command, from_state, to_state, actor_id, role, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
