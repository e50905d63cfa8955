-- postgres schema version 8: single positions. Released: never edit; add a new version.

CREATE OR REPLACE FUNCTION "ledger_reserve_positions"(n integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $body$
DECLARE
  first bigint;
BEGIN
  -- announce first: every position drawn below is at least the value read here
  PERFORM pg_advisory_xact_lock_shared(4611686018427387904 + (SELECT last_value FROM "ledger_events_notification_id_seq"));
  BEGIN
    -- a contiguous block: the mutex lives only in this block's savepoint. A single
    -- position takes it too: a nextval between another block's nextval and setval
    -- would land inside that block (schema version 8 fixed this)
    PERFORM pg_advisory_xact_lock(4611686018427387903);
    first := nextval('ledger_events_notification_id_seq');
    PERFORM setval('ledger_events_notification_id_seq', first + n - 1);
    RAISE SQLSTATE 'LGRSV';
  EXCEPTION WHEN SQLSTATE 'LGRSV' THEN
    NULL;  -- rolled back: the mutex is released, the sequence keeps its value
  END;
  RETURN first;
END
$body$;
