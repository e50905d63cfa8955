-- PROBE (not a migration): open_done_ff25; see README.md beside this file
DROP INDEX lg_items_state;
DROP INDEX lg_items_lease;
DROP INDEX lg_items_optional;
DROP INDEX lg_items_leased;
ALTER TABLE lg_items SET (fillfactor = 25);
CREATE TABLE lg_items_open (run_id TEXT NOT NULL, item_id TEXT NOT NULL, seq INTEGER NOT NULL, state TEXT NOT NULL,
  required INTEGER NOT NULL, lease_expires_at TEXT, lease_started_at TEXT, PRIMARY KEY (run_id, item_id));
CREATE INDEX lg_items_open_state ON lg_items_open (run_id, state, seq);
CREATE INDEX lg_items_open_lease ON lg_items_open (lease_expires_at) WHERE state = 'in_progress';
CREATE INDEX lg_items_open_leased ON lg_items_open (run_id, lease_started_at) WHERE state = 'in_progress';
CREATE INDEX lg_items_open_optional ON lg_items_open (run_id, state) WHERE required = 0;
CREATE TABLE lg_items_final (run_id TEXT NOT NULL, state TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY (run_id, state, seq));
CREATE FUNCTION lg_items_sides() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state IN ('pending', 'retryable', 'quarantined', 'in_progress') THEN
    IF TG_OP = 'INSERT' THEN
      INSERT INTO lg_items_open VALUES (NEW.run_id, NEW.item_id, NEW.seq, NEW.state, NEW.required, NEW.lease_expires_at, NEW.lease_started_at);
    ELSE
      UPDATE lg_items_open SET state = NEW.state, required = NEW.required, lease_expires_at = NEW.lease_expires_at,
        lease_started_at = NEW.lease_started_at WHERE run_id = NEW.run_id AND item_id = NEW.item_id;
    END IF;
  ELSIF TG_OP = 'INSERT' OR OLD.state <> NEW.state THEN
    DELETE FROM lg_items_open WHERE run_id = NEW.run_id AND item_id = NEW.item_id;
    INSERT INTO lg_items_final VALUES (NEW.run_id, NEW.state, NEW.seq) ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER lg_items_sides AFTER INSERT OR UPDATE ON lg_items FOR EACH ROW
  WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION lg_items_sides();
