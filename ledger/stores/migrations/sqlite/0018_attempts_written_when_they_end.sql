-- sqlite schema version 18: an attempt's row is written when it ends. Released: never edit; add a new version.

-- when the item's live lease was granted: the open attempt's start. The open attempt is
-- read from the item row (its lease), and its lg_attempts row is written when it ends.
ALTER TABLE lg_items ADD COLUMN lease_started_at TEXT;

-- an item in progress takes its open attempt's start from that attempt's row (its worker,
-- token and expiry are the item's lease already)
UPDATE lg_items SET lease_started_at = (SELECT a.started_at FROM lg_attempts a
WHERE a.run_id = lg_items.run_id AND a.item_id = lg_items.item_id
AND a.attempt = lg_items.attempts AND a.finished_at IS NULL)
WHERE state = 'in_progress';

-- the open attempts' rows go: their attempts are read from the item rows
DELETE FROM lg_attempts WHERE finished_at IS NULL;

-- the open attempts by start, for the paged reads of a run's attempts
CREATE INDEX IF NOT EXISTS lg_items_leased ON lg_items (run_id, lease_started_at) WHERE state = 'in_progress';
