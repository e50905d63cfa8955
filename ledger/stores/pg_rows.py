"""PostgreSQL: a replay's projection rows written a statement at a time, as a JSON array
of arrays (`RowsSql.pg_array_form`, ledger/stores/statements.py).

A rebuild, verify, an import or a restore writes tens of thousands of rows a batch; as
objects keyed by column name (`PgTx.executemany`'s bulk form) encoding them was a fifth
of an import's client CPU. Here each row goes as its tuple, and the statement casts each
value to its column's type, read once from the catalog per table.

Only values whose JSON text `jsonb` gives back unchanged go this way: integers, text
and null (UUIDs as text). A float would come back from a jsonb number in another
notation ("1e-05" as "0.00001"), and a bool would not cast to an integer column, so
rows holding any other type are left to `executemany`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any
from uuid import UUID

import orjson

from ledger.stores.base import Tx
from ledger.stores.sql import STATEMENTS
from ledger.stores.statements import RowsSql

_EXACT = frozenset((int, str, type(None), UUID))


class ArrayRows:
    """Writes `RowsSql` statements' rows in their array form on one PostgreSQL ledger,
    keeping each table's column types (read from the catalog on first use)."""

    def __init__(self) -> None:
        self._types: dict[str, dict[str, str]] = {}
        self._sql: dict[tuple[str, str], str] = {}

    def load_types(self, tx: Tx, tables: Sequence[str]) -> None:
        """Read the column types of `tables` now (one query), so later writes need none."""
        missing = [t for t in dict.fromkeys(tables) if t not in self._types]
        if not missing:
            return
        rows = tx.fetchall(STATEMENTS.sql(tx, "pg_column_types"), (missing,))
        for t in missing:
            self._types[t] = {}
        for r in rows:
            self._types[r["tab"]][r["col"]] = r["typ"]

    def write(self, tx: Tx, sql: str, rows: Sequence[Sequence[Any]]) -> bool:
        """Write `rows` of `sql` in one statement if it has an array form and the rows go
        exactly that way; False when not done (the caller writes them otherwise)."""
        if not isinstance(sql, RowsSql) or not sql.table or tx.store.dialect != "postgres":
            return False
        key = (sql, sql.table)
        text = self._sql.get(key)
        if text is None:
            self.load_types(tx, [sql.table])
            types = self._types[sql.table]
            if not all(n in types for n in sql.names):
                return False
            text = self._sql[key] = sql.pg_array_form(types)
        if not _EXACT.issuperset(map(type, chain.from_iterable(rows))):
            return False
        # only ints, text, null and UUIDs (checked above): orjson writes them as the
        # standard library did (a UUID as its text), in a sixth of its time; it refuses
        # an integer beyond 64 bits, left to `executemany` like the types above
        try:
            param = orjson.dumps(rows).decode()
        except TypeError:
            return False
        tx.execute(text, (param,))
        return True
