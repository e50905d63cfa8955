"""`Ledger.open` on a store it cannot reach raises the typed `StoreUnavailable` (a
`LedgerError`), as a missing SQLite file does, with the password redacted."""

from __future__ import annotations

import pytest

from ledger import Ledger, LedgerError
from ledger.core.errors import StoreUnavailable
from tests.support.pgserver import free_port


def test_an_unreachable_postgresql_is_store_unavailable() -> None:
    dsn = f"postgresql://app:hunter2-secret@127.0.0.1:{free_port()}/ledger?connect_timeout=5"
    with pytest.raises(StoreUnavailable) as caught:
        Ledger.open(dsn)
    assert isinstance(caught.value, LedgerError)
    assert "hunter2-secret" not in str(caught.value)
    assert "PostgreSQL" in str(caught.value)


@pytest.mark.postgres
def test_a_missing_database_is_store_unavailable(pg_dsn: str) -> None:
    base, _, _name = pg_dsn.rpartition("/")
    with pytest.raises(StoreUnavailable, match="does_not_exist_here"):
        Ledger.open(f"{base}/does_not_exist_here")


def test_a_missing_sqlite_file_is_store_unavailable_for_a_read(tmp_path: object) -> None:
    from ledger.stores import open_store

    with pytest.raises(StoreUnavailable):
        open_store(f"sqlite:///{tmp_path}/nope.db", create=False)
