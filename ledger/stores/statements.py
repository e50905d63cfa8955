"""Row statements written out in both forms: one row per execution (`?` placeholders, every
store) and, for PostgreSQL, every row at once in one JSON parameter.

A `RowsSql` is the one-row SQL text itself (a `str`: it runs, compares and keys a dict
as that text), carrying its bulk form, so no code has to rewrite SQL to batch it. The
bulk form expands a JSON array of objects keyed by column name with
`json_populate_recordset` and the table's own column types: the statement text is short
and the same for any number of rows, so psycopg converts it once and the server keeps
it prepared, and encoding the rows is one `json.dumps` (measured 4-7x less client CPU
than a multi-row VALUES list, whose placeholders psycopg parses again on every call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class RowsSql(str):
    """A one-row INSERT or UPDATE (`?` placeholders) with its PostgreSQL bulk form."""

    pg_bulk: str  # one `%s` parameter: a JSON array of objects keyed by `names`
    names: tuple[str, ...]  # the parameters of the one-row form, in order

    def __new__(cls, one_row: str, pg_bulk: str, names: Sequence[str]) -> RowsSql:
        self = super().__new__(cls, one_row)
        self.pg_bulk = pg_bulk
        self.names = tuple(names)
        return self


def insert(
    table: str,
    columns: Sequence[str],
    literals: Mapping[str, str] | None = None,
    tail: str = "",
) -> RowsSql:
    """`INSERT INTO table (columns) VALUES (...)` + `tail`: a `?` per column, or the SQL
    literal given for it in `literals` (the same in every row)."""
    literals = literals or {}
    cols = ", ".join(columns)
    values = ", ".join(literals.get(c, "?") for c in columns)
    select = ", ".join(literals.get(c, f"v.{c}") for c in columns)
    return RowsSql(
        f"INSERT INTO {table} ({cols}) VALUES ({values}){tail}",  # noqa: S608 (our own table/column names; values are bound)
        f"INSERT INTO {table} ({cols}) SELECT {select} "  # noqa: S608 (our own table/column names; values are bound)
        f"FROM json_populate_recordset(NULL::{table}, %s::json) AS v{tail}",
        [c for c in columns if c not in literals],
    )


def update(table: str, columns: Sequence[str], keys: Sequence[str]) -> RowsSql:
    """`UPDATE table SET column = ?, ... WHERE key = ? AND ...` (parameters: the columns,
    then the keys)."""
    return RowsSql(
        f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} "  # noqa: S608 (our own table/column names; values are bound)
        f"WHERE {' AND '.join(f'{k} = ?' for k in keys)}",
        f"UPDATE {table} AS t SET {', '.join(f'{c} = v.{c}' for c in columns)} "  # noqa: S608 (our own table/column names; values are bound)
        f"FROM json_populate_recordset(NULL::{table}, %s::json) AS v "
        f"WHERE {' AND '.join(f't.{k} = v.{k}' for k in keys)}",
        [*columns, *keys],
    )
