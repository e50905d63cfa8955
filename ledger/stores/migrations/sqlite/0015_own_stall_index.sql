-- sqlite schema version 15: the running runs whose policy sets its own stall threshold. Released: never edit; add a new version.

CREATE INDEX IF NOT EXISTS lg_runs_own_stall ON lg_runs (state, seq) WHERE length(replace(policy, '"stall_seconds"', '')) < length(policy);
