-- postgres schema version 6: paging indexes. Released: never edit; add a new version.

CREATE INDEX IF NOT EXISTS lg_items_seq ON lg_items (run_id, seq);

CREATE INDEX IF NOT EXISTS lg_attempts_started ON lg_attempts (run_id, started_at);
