-- sqlite schema version 7: run counts. Released: never edit; add a new version.

CREATE TABLE IF NOT EXISTS lg_run_counts (
            run_id TEXT NOT NULL,
            slot INTEGER NOT NULL,
            state TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (run_id, slot, state)
        );

DELETE FROM lg_run_counts;

INSERT INTO lg_run_counts (run_id, slot, state, n) SELECT d.run_id, d.slot, d.state, SUM(d.n) FROM (SELECT t.run_id, (CAST(substr(t.at, 21, 6) AS INTEGER) % 64) AS slot, t.from_state AS state, -1 AS n FROM lg_transitions t WHERE t.item_id IS NOT NULL UNION ALL SELECT t.run_id, (CAST(substr(t.at, 21, 6) AS INTEGER) % 64), t.to_state, 1 FROM lg_transitions t WHERE t.item_id IS NOT NULL UNION ALL SELECT t.run_id, (CAST(substr(t.at, 21, 6) AS INTEGER) % 64), 'pending', CAST(json_extract(t.evidence, '$.items') AS INTEGER) FROM lg_transitions t WHERE t.item_id IS NULL AND t.from_state = '-' UNION ALL SELECT t.run_id, (CAST(substr(t.at, 21, 6) AS INTEGER) % 64), 'pending', json_array_length(t.evidence, '$.added') FROM lg_transitions t WHERE t.item_id IS NULL AND t.command = 'amend' AND json_array_length(t.evidence, '$.added') > 0) d JOIN lg_runs r ON r.run_id = d.run_id WHERE r.state NOT IN ('canceled', 'completed_with_errors', 'failed', 'succeeded') GROUP BY d.run_id, d.slot, d.state;

UPDATE lg_runs SET counts = '{}' WHERE state NOT IN ('canceled', 'completed_with_errors', 'failed', 'succeeded');
