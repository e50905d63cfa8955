-- sqlite schema version 5: positions. Released: never edit; add a new version.

INSERT INTO ledger_meta (key, value) VALUES ('positions', 'commit order') ON CONFLICT (key) DO UPDATE SET value = excluded.value;
