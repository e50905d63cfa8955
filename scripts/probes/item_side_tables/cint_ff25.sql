-- PROBE (not a migration): cint_ff25; see README.md beside this file
DROP INDEX lg_items_state;
DROP INDEX lg_items_lease;
DROP INDEX lg_items_optional;
DROP INDEX lg_items_leased;
ALTER TABLE lg_items SET (fillfactor = 25);
CREATE TABLE lg_items_waiting (run_id BIGINT NOT NULL, state TEXT NOT NULL, seq INTEGER NOT NULL,
  required INTEGER NOT NULL, PRIMARY KEY (run_id, state, seq));
CREATE INDEX lg_items_waiting_optional ON lg_items_waiting (run_id, state) WHERE required = 0;
CREATE TABLE lg_leases (run_id BIGINT NOT NULL, seq INTEGER NOT NULL, required INTEGER NOT NULL,
  lease_expires_at TEXT NOT NULL, lease_started_at TEXT, PRIMARY KEY (run_id, seq));
CREATE INDEX lg_leases_expiry ON lg_leases (lease_expires_at);
CREATE INDEX lg_leases_started ON lg_leases (run_id, lease_started_at);
CREATE INDEX lg_leases_optional ON lg_leases (run_id) WHERE required = 0;
CREATE TABLE lg_items_final (run_id BIGINT NOT NULL, state TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY (run_id, state, seq));
CREATE FUNCTION lg_items_sides() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE rs BIGINT;
BEGIN
  rs := hashtextextended(NEW.run_id, 0);
  IF TG_OP = 'UPDATE' THEN
    IF OLD.state IN ('pending', 'retryable', 'quarantined') THEN
      DELETE FROM lg_items_waiting WHERE run_id = rs AND state = OLD.state AND seq = OLD.seq;
    ELSIF OLD.state = 'in_progress' THEN
      DELETE FROM lg_leases WHERE run_id = rs AND seq = OLD.seq;
    END IF;
  END IF;
  IF NEW.state IN ('pending', 'retryable', 'quarantined') THEN
    INSERT INTO lg_items_waiting VALUES (rs, NEW.state, NEW.seq, NEW.required);
  ELSIF NEW.state = 'in_progress' THEN
    INSERT INTO lg_leases VALUES (rs, NEW.seq, NEW.required, NEW.lease_expires_at, NEW.lease_started_at);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER lg_items_sides AFTER INSERT OR UPDATE ON lg_items FOR EACH ROW
  WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION lg_items_sides();
