-- sqlite schema version 1: initial. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS stored_events (originator_id TEXT, originator_version INTEGER, topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version));

CREATE TABLE IF NOT EXISTS lg_runs (
            run_id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            source_version TEXT NOT NULL,
            config_version TEXT NOT NULL,
            scope TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            stopped_at TEXT,
            updated_at TEXT NOT NULL,
            failure_kind TEXT,
            failure_reason TEXT,
            stop_reason TEXT,
            summary TEXT NOT NULL,
            input_version TEXT NOT NULL,
            policy TEXT NOT NULL,
            review TEXT,
            cancel_requested INTEGER NOT NULL,
            links TEXT NOT NULL,
            root_run_id TEXT NOT NULL,
            counts TEXT NOT NULL,
            item_count INTEGER NOT NULL
        );

CREATE INDEX IF NOT EXISTS lg_runs_state ON lg_runs (state, seq);

CREATE INDEX IF NOT EXISTS lg_runs_seq ON lg_runs (seq);

CREATE INDEX IF NOT EXISTS lg_runs_root ON lg_runs (root_run_id, seq);

CREATE TABLE IF NOT EXISTS lg_items (
            run_id TEXT NOT NULL,
            item_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            required INTEGER NOT NULL,
            payload TEXT NOT NULL,
            in_manifest INTEGER NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            lease_token TEXT,
            lease_worker TEXT,
            lease_expires_at TEXT,
            eligible_at TEXT,
            last_error TEXT,
            reason TEXT,
            updated_at TEXT,
            PRIMARY KEY (run_id, item_id)
        );

CREATE INDEX IF NOT EXISTS lg_items_state ON lg_items (run_id, state, seq);

CREATE INDEX IF NOT EXISTS lg_items_lease ON lg_items (state, lease_expires_at);

CREATE INDEX IF NOT EXISTS lg_items_seq ON lg_items (run_id, seq);

CREATE INDEX IF NOT EXISTS lg_items_optional ON lg_items (run_id, state) WHERE required = 0;

CREATE TABLE IF NOT EXISTS lg_attempts (
            run_id TEXT NOT NULL,
            item_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            worker_id TEXT NOT NULL,
            lease_token TEXT NOT NULL,
            started_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            finished_at TEXT,
            stage TEXT,
            outcome TEXT,
            error TEXT,
            PRIMARY KEY (run_id, item_id, attempt)
        );

CREATE INDEX IF NOT EXISTS lg_attempts_started ON lg_attempts (run_id, started_at);

CREATE TABLE IF NOT EXISTS lg_transitions (
            position INTEGER NOT NULL,
            ord INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            item_id TEXT,
            command TEXT NOT NULL,
            from_state TEXT NOT NULL,
            to_state TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            role TEXT NOT NULL,
            reason TEXT,
            evidence TEXT NOT NULL,
            at TEXT NOT NULL,
            revision INTEGER NOT NULL,
            PRIMARY KEY (position, ord)
        );

CREATE INDEX IF NOT EXISTS lg_transitions_run ON lg_transitions (run_id, position, ord);

CREATE INDEX IF NOT EXISTS lg_transitions_actor ON lg_transitions (actor_id, position, ord);

CREATE INDEX IF NOT EXISTS lg_transitions_role ON lg_transitions (role, position, ord);

CREATE INDEX IF NOT EXISTS lg_transitions_state ON lg_transitions (to_state, position, ord);

CREATE INDEX IF NOT EXISTS lg_transitions_at ON lg_transitions (at, position, ord);

CREATE TABLE IF NOT EXISTS lg_run_counts (
            run_id TEXT NOT NULL,
            slot INTEGER NOT NULL,
            state TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (run_id, slot, state)
        );

CREATE TABLE IF NOT EXISTS lg_tracking (name TEXT PRIMARY KEY, position INTEGER NOT NULL);
