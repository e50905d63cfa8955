-- postgres schema version 14: overview indexes. Released: never edit; add a new version.

CREATE INDEX IF NOT EXISTS lg_runs_created ON lg_runs (state, created_at, seq);

CREATE INDEX IF NOT EXISTS lg_runs_updated ON lg_runs (state, updated_at, seq);
