-- The statements of the HTTP service (ledger/http/), by name; read through
-- ledger/http/sql.py.

-- name: tally_end
-- the end of the next page of transitions to tally (a page after a position)
SELECT MAX(position) AS p FROM (SELECT position FROM lg_transitions
WHERE position > ? ORDER BY position LIMIT ?) page;

-- name: tally_end_upto
-- the same, not past the readable bound
SELECT MAX(position) AS p FROM (SELECT position FROM lg_transitions
WHERE position > ? AND position <= ? ORDER BY position LIMIT ?) page;

-- name: tally_by_command
SELECT command, COUNT(*) AS n FROM lg_transitions
WHERE position > ? AND position <= ? GROUP BY command;
