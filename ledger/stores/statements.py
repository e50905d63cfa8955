"""Row statements written out in both forms: one row per execution (`?` placeholders, every
store) and, for PostgreSQL, every row at once in one JSON parameter.

A `RowsSql` is the one-row SQL text itself (a `str`: it runs, compares and keys a dict
as that text), carrying its bulk form, so no code has to rewrite SQL to batch it. The
bulk form expands a JSON array of objects keyed by column name with
`json_populate_recordset` and the table's own column types: the statement text is short
and the same for any number of rows, so psycopg converts it once and the server keeps
it prepared, and encoding the rows is one `json.dumps` (measured 4-7x less client CPU
than a multi-row VALUES list, whose placeholders psycopg parses again on every call).

`pg_array_form` writes a third form, for callers that know the columns' types (a replay
into the projection tables, ledger/stores/pg_rows.py): the rows as a JSON array of
arrays, each value cast to its column's type. Its parameter is a `json.dumps` of the row
tuples as they are (no dict per row, no key per value): measured on 40,000 transition
rows, a third of the client CPU of the objects and a quarter less server time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Constant = int | str  # a value every row of an insert has, written into its SQL


class RowsSql(str):
    """A one-row INSERT or UPDATE (`?` placeholders) with its PostgreSQL bulk form.

    A plain insert (`insert()` without a `tail`) also has its many-row forms:
    `values_many(n)` (n rows of VALUES, any store) and `copy_sql` with `copy_row`
    (PostgreSQL's COPY, the constants filled in)."""

    pg_bulk: str  # one `%s` parameter: a JSON array of objects keyed by `names`
    names: tuple[str, ...]  # the parameters of the one-row form, in order
    table: str
    columns: tuple[str, ...]  # the columns written (an insert's in order; an update's SET)
    constants: dict[str, Constant]  # an insert's columns given one value for every row
    tail: str  # an insert's clause after its VALUES (ON CONFLICT ...)
    _is_insert: bool
    _one_values: str
    # pg_array_form(types): the SQL around the array of arrays, given each name's type
    _array_form: Callable[[Mapping[str, str]], str]

    def __new__(
        cls,
        one_row: str,
        pg_bulk: str,
        names: Sequence[str],
        table: str = "",
        array_form: Callable[[Mapping[str, str]], str] | None = None,
        *,
        columns: Sequence[str] = (),
        constants: Mapping[str, Constant] | None = None,
        tail: str = "",
        is_insert: bool = False,
    ) -> RowsSql:
        self = super().__new__(cls, one_row)
        self.pg_bulk = pg_bulk
        self.names = tuple(names)
        self.table = table
        self._array_form = array_form or _no_array_form
        self.columns = tuple(columns) or self.names
        self.constants = dict(constants or {})
        self.tail = tail
        self._is_insert = is_insert
        # one row's VALUES tuple: `?` per parameter, each constant as its literal
        self._one_values = (
            "(" + ", ".join(_literal_or_slot(self.constants, c) for c in self.columns) + ")"
        )
        return self

    @property
    def plain_insert(self) -> bool:
        """An insert with no clause after its VALUES: it has a COPY form."""
        return self._is_insert and not self.tail

    def values_many(self, n: int) -> str:
        """The insert of `n` rows in one statement: `n` VALUES tuples, the parameters of
        each row in `names` order, row after row."""
        assert self._is_insert and n >= 1, "an insert of at least one row"
        return (
            f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES "  # noqa: S608 (our own table/column names; values are bound)
            + ", ".join([self._one_values] * n)
            + self.tail
        )

    @property
    def copy_sql(self) -> str:
        """PostgreSQL's `COPY table (columns) FROM STDIN` for a plain insert's rows."""
        assert self.plain_insert, "COPY takes the rows of a plain insert"
        return f"COPY {self.table} ({', '.join(self.columns)}) FROM STDIN"

    def copy_row(self, row: Sequence[Any]) -> list[Any]:
        """One row of the one-row form's parameters as COPY takes it: every column, the
        constants in their places."""
        it = iter(row)
        consts = self.constants
        return [consts[c] if c in consts else next(it) for c in self.columns]

    def pg_array_form(self, types: Mapping[str, str]) -> str:
        """Every row at once on PostgreSQL, from one `?` parameter: a JSON array (jsonb)
        of arrays of the `names` values in order, each cast to `types[name]` (the column's
        SQL type). Rows are inserted or updated in the array's order."""
        return self._array_form(types)


def _no_array_form(types: Mapping[str, str]) -> str:
    raise ValueError("this statement has no array form")


def _casts(names: Sequence[str], types: Mapping[str, str]) -> dict[str, str]:
    return {n: f"(e->>{k})::{types[n]}" for k, n in enumerate(names)}


def _sql_literal(value: Constant) -> str:
    if isinstance(value, int):
        return str(int(value))
    return "'" + value.replace("'", "''") + "'"


def _literal_or_slot(constants: Mapping[str, Constant], column: str) -> str:
    return _sql_literal(constants[column]) if column in constants else "?"


def insert(
    table: str,
    columns: Sequence[str],
    constants: Mapping[str, Constant] | None = None,
    tail: str = "",
) -> RowsSql:
    """`INSERT INTO table (columns) VALUES (...)` + `tail`: a `?` per column, or the
    value given for it in `constants` (the same in every row), written as an SQL literal."""
    constants = dict(constants or {})
    literals = {c: _sql_literal(v) for c, v in constants.items()}
    cols = ", ".join(columns)
    values = ", ".join(_literal_or_slot(constants, c) for c in columns)
    select = ", ".join(literals.get(c, f"v.{c}") for c in columns)
    names = [c for c in columns if c not in literals]

    def array_form(types: Mapping[str, str]) -> str:
        cast = _casts(names, types)
        picks = ", ".join(literals.get(c) or cast[c] for c in columns)
        return (
            f"INSERT INTO {table} ({cols}) SELECT {picks} "  # noqa: S608 (our own table/column names and types; values are bound)
            f"FROM jsonb_array_elements(?::jsonb) AS x(e){tail}"
        )

    return RowsSql(
        f"INSERT INTO {table} ({cols}) VALUES ({values}){tail}",  # noqa: S608 (our own table/column names; values are bound)
        f"INSERT INTO {table} ({cols}) SELECT {select} "  # noqa: S608 (our own table/column names; values are bound)
        f"FROM json_populate_recordset(NULL::{table}, %s::json) AS v{tail}",
        names,
        table,
        array_form,
        columns=columns,
        constants=constants,
        tail=tail,
        is_insert=True,
    )


def update(table: str, columns: Sequence[str], keys: Sequence[str]) -> RowsSql:
    """`UPDATE table SET column = ?, ... WHERE key = ? AND ...` (parameters: the columns,
    then the keys)."""
    names = [*columns, *keys]
    assert len(set(names)) == len(names), "a key is not also a column"

    def array_form(types: Mapping[str, str]) -> str:
        cast = _casts(names, types)
        return (
            f"UPDATE {table} AS t SET {', '.join(f'{c} = v.{c}' for c in columns)} "  # noqa: S608 (our own table/column names and types; values are bound)
            f"FROM (SELECT {', '.join(f'{cast[n]} AS {n}' for n in names)} "
            "FROM jsonb_array_elements(?::jsonb) AS x(e)) AS v "
            f"WHERE {' AND '.join(f't.{k} = v.{k}' for k in keys)}"
        )

    return RowsSql(
        f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} "  # noqa: S608 (our own table/column names; values are bound)
        f"WHERE {' AND '.join(f'{k} = ?' for k in keys)}",
        f"UPDATE {table} AS t SET {', '.join(f'{c} = v.{c}' for c in columns)} "  # noqa: S608 (our own table/column names; values are bound)
        f"FROM json_populate_recordset(NULL::{table}, %s::json) AS v "
        f"WHERE {' AND '.join(f't.{k} = v.{k}' for k in keys)}",
        names,
        table,
        array_form,
        columns=columns,
    )
