-- postgres schema version 10: optional items index. Released: never edit; add a new version.

CREATE INDEX IF NOT EXISTS lg_items_optional ON lg_items (run_id, state) WHERE required = 0;
