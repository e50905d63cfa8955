"""PostgreSQL: verify's scratch-table statements are not prepared (their table names are
new on every verify). Prepared, they filled psycopg's cache of 100 statements per
connection, whose evictions inside a pipeline then made a later statement name one it had
deallocated ("prepared statement _pg3_N does not exist": test_verify's small pages case
on PostgreSQL, once item streams stopped beginning with Registered)."""

from __future__ import annotations

import pytest

from ledger import Ledger
from ledger.stores.base import SCRATCH_MARK
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

pytestmark = pytest.mark.postgres


def test_verify_leaves_no_prepared_statement_of_its_scratch_tables(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        for lease in lg.claim(run, WORKER, limit=3):
            lg.accept(lease)
        for _ in range(3):
            assert lg.verify().ok
        with lg.store.read() as tx:
            rows = tx.fetchall("SELECT statement FROM pg_prepared_statements", ())
        assert rows  # the ledger's own statements are prepared
        assert not [r for r in rows if SCRATCH_MARK in r["statement"]]
