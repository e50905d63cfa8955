"""`checksums.tables_equal` (verify's comparison of a rebuild with the live tables) says
two tables are equal exactly when they hold the same rows, on every store."""

from __future__ import annotations

from ledger import Ledger
from ledger.projections.checksums import table_checksum, tables_equal
from ledger.projections.rebuild import create_tables, drop_tables
from ledger.projections.writer import Projector

RUN = "0b6f64b2-6c1f-4a3e-9d67-3b8f1e2f4c11"
ROWS = [(RUN, f"doc-{k}", k, 1, '{"n":1}') for k in range(5)]


def test_tables_are_equal_only_when_their_rows_are(store_dsn: str) -> None:
    with Ledger.open(store_dsn) as lg, lg.store.write() as tx:
        for suffix in ("_eq_a", "_eq_b"):
            create_tables(tx, suffix)
            tx.executemany(str(Projector(suffix).insert_item), ROWS)
        try:

            def same() -> bool:
                verdict = tables_equal(tx, "lg_items", "_eq_a", "_eq_b")
                key = ("run_id", "item_id")
                sums = (
                    table_checksum(tx, "lg_items_eq_a", key),
                    table_checksum(tx, "lg_items_eq_b", key),
                )
                assert verdict == (sums[0] == sums[1])  # what the checksums say
                return verdict

            assert same()
            tx.execute("UPDATE lg_items_eq_b SET reason = ? WHERE item_id = ?", ("x", "doc-2"))
            assert not same()  # a NULL against a value
            tx.execute("UPDATE lg_items_eq_b SET reason = NULL WHERE item_id = ?", ("doc-2",))
            assert same()
            tx.execute("DELETE FROM lg_items_eq_a WHERE item_id = ?", ("doc-4",))
            assert not same()  # a row missing from the first
            assert not tables_equal(tx, "lg_items", "_eq_b", "_eq_a")  # an extra one
            assert tables_equal(tx, "lg_runs", "_eq_a", "_eq_b")  # both empty
        finally:
            drop_tables(tx, "_eq_a")
            drop_tables(tx, "_eq_b")
