"""PostgreSQL positions in commit-safe order without a table lock (schema version 5).

A position is drawn from the events table's sequence when its row is inserted but
becomes visible when its transaction commits, so a reader resuming "after the last
position seen" could pass a position that a slower transaction fills in later. The
eventsourcing recorder avoids it with `LOCK TABLE ... IN EXCLUSIVE MODE` on every
insert, held until commit: every write of the whole ledger waits for the previous
one. Here writers never wait for each other, and readers stop below what may still
appear:

- A writer *announces* before it draws: it takes a shared transaction-level advisory
  lock keyed by the sequence's current value (`ANNOUNCE_BASE + last_value`), which is
  at most any position it will draw. Shared locks never conflict; the lock lives until
  the transaction ends. Then it draws a contiguous block (its events are never
  interleaved with another transaction's: eventsourcing's non-interleaving case).
- A reader first asks `ledger_readable_position()`: the sequence's value, then the
  lowest key still announced by another session (from `pg_locks`), and reads only
  positions at or below min(value, lowest announced - 1), in a later statement (a
  newer snapshot). A transaction that announces after that check draws above the
  value read; one announced before it is either seen in `pg_locks` (still running)
  or visible to the next statement (a committing transaction is visible before it
  releases its locks). So no position ever appears at or below a bound once read.

A long-running writer delays readers (lag), it never makes them skip an event; only
the ledger's own writers count, not other transactions on the server. Positions stay
the integers of the sequence (dense but for rolled-back transactions), so the public
API, saved histories and the library's recorder test cases are unchanged. In a
repeatable-read transaction the snapshot is fixed: the function returns NULL and the
reader reads what its snapshot holds (verify compares one snapshot with itself).

The block is reserved under a mutex that is released at once, not at commit: an
advisory lock taken inside a PL/pgSQL exception block, whose savepoint is rolled back
on purpose right after `nextval`/`setval` (sequence changes survive a rollback, the
lock does not; any error releases it the same way).

Both functions are SECURITY DEFINER so that a login role with only USAGE on the
sequence (tests/stores/test_postgres.py) can run them: reading `last_value` needs SELECT and
`setval` UPDATE on it.
"""

from __future__ import annotations

from psycopg import sql

from ledger.core.recorded import TRANSITION_COLUMNS

# Announcement keys: ANNOUNCE_BASE + position, as one bigint advisory key. In pg_locks a
# bigint key shows as classid (high 32 bits), objid (low 32 bits), objsubid 1; the base
# puts our keys in classid [2^30, 2^31), away from small keys such as the schema lock.
ANNOUNCE_BASE = 1 << 62
RESERVE_KEY = ANNOUNCE_BASE - 1  # the block-reservation mutex (classid 2^30 - 1: not a key)
_CLASSID_BASE = 1 << 30

RESERVE_FUNCTION = "ledger_reserve_positions"
READABLE_FUNCTION = "ledger_readable_position"


def sequence_name(events_table: str) -> str:
    """The events table's position sequence (its `notification_id bigserial`)."""
    return f"{events_table}_notification_id_seq"


def ddl(events_table: str) -> list[sql.Composed]:
    """The two functions (schema version 4)."""
    seq = sql.Identifier(sequence_name(events_table))
    seq_text = sql.Literal(sequence_name(events_table))
    reserve = sql.SQL(
        """
CREATE OR REPLACE FUNCTION {name}(n integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $body$
DECLARE
  first bigint;
BEGIN
  -- announce first: every position drawn below is at least the value read here
  PERFORM pg_advisory_xact_lock_shared({base} + (SELECT last_value FROM {seq}));
  BEGIN
    -- a contiguous block: the mutex lives only in this block's savepoint. A single
    -- position takes it too: a nextval between another block's nextval and setval
    -- would land inside that block (schema version 8 fixed this)
    PERFORM pg_advisory_xact_lock({mutex});
    first := nextval({seq_text});
    PERFORM setval({seq_text}, first + n - 1);
    RAISE SQLSTATE 'LGRSV';
  EXCEPTION WHEN SQLSTATE 'LGRSV' THEN
    NULL;  -- rolled back: the mutex is released, the sequence keeps its value
  END;
  RETURN first;
END
$body$
"""
    ).format(
        name=sql.Identifier(RESERVE_FUNCTION),
        base=sql.Literal(ANNOUNCE_BASE),
        mutex=sql.Literal(RESERVE_KEY),
        seq=seq,
        seq_text=seq_text,
    )
    readable = sql.SQL(
        """
CREATE OR REPLACE FUNCTION {name}() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $body$
DECLARE
  drawn bigint;
  announced bigint;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN NULL;  -- a fixed snapshot: read what it holds
  END IF;
  -- in this order: a writer announcing after the first read draws above it
  drawn := (SELECT last_value FROM {seq});
  announced := (
    SELECT min(((l.classid::bigint - {classid_base}) << 32) + l.objid::bigint)
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1
      AND l.classid::bigint >= {classid_base} AND l.classid::bigint < {classid_end}
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.pid <> pg_backend_pid()
  );
  RETURN LEAST(drawn, announced - 1);
END
$body$
"""
    ).format(
        name=sql.Identifier(READABLE_FUNCTION),
        seq=seq,
        classid_base=sql.Literal(_CLASSID_BASE),
        classid_end=sql.Literal(2 * _CLASSID_BASE),
    )
    return [reserve, readable]


READABLE_QUERY = sql.SQL("SELECT {}() AS p").format(sql.Identifier(READABLE_FUNCTION))


# the ledger's own events table's columns after the library's four (`hashed`): each event's
# hash (schema version 11) and its transition columns (schema version 17,
# ledger/core/recorded.py)
LEDGER_COLUMNS = ("hash", *TRANSITION_COLUMNS)


def insert_json_statement(table: sql.Composable, hashed: bool = False) -> sql.Composed:
    """Insert events given as one JSON array of [id, version, topic, state text] (with
    `hashed`, the ledger's table: then the event's hash and its transition columns,
    `LEDGER_COLUMNS`), positions from one reserved block (parameters: the array's
    length, the array).

    The array is read as jsonb, parsed once: each `->>` of a `json` value parses its
    element's text again, and an event's thirteen fields made that 53-76 us of server
    time per event against 8-9 us as jsonb (EXPLAIN ANALYZE, 200-event inserts). The
    strings read back are the same (the states go in NUL-free, `_events_json`)."""
    extra = LEDGER_COLUMNS if hashed else ()
    return sql.SQL(
        "WITH r AS MATERIALIZED (SELECT {reserve}(%s) AS first) "
        "INSERT INTO {table} (notification_id, originator_id, originator_version, topic, "
        "state{columns}) "
        "SELECT r.first + x.n - 1, (x.e->>0)::uuid, (x.e->>1)::bigint, x.e->>2, "
        "convert_to(x.e->>3, 'UTF8'){values} "
        "FROM r, jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS x(e, n) "
        "RETURNING notification_id"
    ).format(
        reserve=sql.Identifier(RESERVE_FUNCTION),
        table=table,
        columns=sql.SQL("").join(sql.SQL(", ") + sql.Identifier(c) for c in extra),
        values=sql.SQL("").join(
            sql.SQL(", x.e->>{}").format(sql.Literal(4 + i)) for i in range(len(extra))
        ),
    )


def insert_arrays_statement(
    table: sql.Composable, id_type: str, hashed: bool = False
) -> sql.Composed:
    """Insert events given as parallel arrays (parameters: the length, ids, versions,
    topics, states, and with `hashed` one text array per `LEDGER_COLUMNS`): for states
    that are not UTF-8 text."""
    extra = LEDGER_COLUMNS if hashed else ()
    return sql.SQL(
        "WITH r AS MATERIALIZED (SELECT {reserve}(%s) AS first) "
        "INSERT INTO {table} (notification_id, originator_id, originator_version, topic, "
        "state{columns}) SELECT r.first + x.n - 1, x.i, x.v, x.t, x.s{values} "
        "FROM r, unnest(%s::{id_type}[], %s::bigint[], %s::text[], %s::bytea[]{arrays}) "
        "WITH ORDINALITY AS x(i, v, t, s{names}, n) "
        "RETURNING notification_id"
    ).format(
        reserve=sql.Identifier(RESERVE_FUNCTION),
        table=table,
        id_type=sql.SQL(id_type),
        columns=sql.SQL("").join(sql.SQL(", ") + sql.Identifier(c) for c in extra),
        values=sql.SQL("").join(
            sql.SQL(", x.c{}").format(sql.SQL(str(i))) for i in range(len(extra))
        ),
        arrays=sql.SQL("").join(sql.SQL(", %s::text[]") for _ in extra),
        names=sql.SQL("").join(sql.SQL(", c{}").format(sql.SQL(str(i))) for i in range(len(extra))),
    )
