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

The texts are joined from our own table and column names, each quoted as an identifier
(`named.quoted`, the same on both stores), and the column types PostgreSQL's catalog
spells (`named.sql_type`); values are parameters, but for an insert's `constants`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledger.stores.named import quoted, sql_type

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
        return "".join(
            (
                "INSERT INTO ",
                quoted(self.table),
                _listed(self.columns),
                " VALUES ",
                ", ".join([self._one_values] * n),
                self.tail,
            )
        )

    @property
    def copy_sql(self) -> str:
        """PostgreSQL's `COPY table (columns) FROM STDIN` for a plain insert's rows."""
        assert self.plain_insert, "COPY takes the rows of a plain insert"
        return "".join(("COPY ", quoted(self.table), _listed(self.columns), " FROM STDIN"))

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


def _listed(columns: Sequence[str]) -> str:
    """` ("a", "b")`: a parenthesised list of quoted column names."""
    return " (" + ", ".join(map(quoted, columns)) + ")"


def _casts(names: Sequence[str], types: Mapping[str, str]) -> dict[str, str]:
    """Each name's value out of the array form's element `e`, cast to its column's type."""
    return {n: "".join(("(e->>", str(k), ")::", sql_type(types[n]))) for k, n in enumerate(names)}


def _sql_literal(value: Constant) -> str:
    if isinstance(value, int):
        return str(int(value))
    return "'" + value.replace("'", "''") + "'"


def _literal_or_slot(constants: Mapping[str, Constant], column: str) -> str:
    return _sql_literal(constants[column]) if column in constants else "?"


def _pairs(left: str, columns: Sequence[str], right: str, sep: str) -> str:
    """`left."c" = right."c"` for each column (`left`/`right` empty: the bare name, or `?`
    when `right` is "?"), joined by `sep`."""
    out = []
    for c in columns:
        name = quoted(c)
        lhs = left + "." + name if left else name
        rhs = "?" if right == "?" else (right + "." + name if right else name)
        out.append(lhs + " = " + rhs)
    return sep.join(out)


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
    into = "".join(("INSERT INTO ", quoted(table), _listed(columns)))
    values = ", ".join(_literal_or_slot(constants, c) for c in columns)
    select = ", ".join(literals.get(c) or "v." + quoted(c) for c in columns)
    names = [c for c in columns if c not in literals]

    def array_form(types: Mapping[str, str]) -> str:
        cast = _casts(names, types)
        picks = ", ".join(literals.get(c) or cast[c] for c in columns)
        return "".join(
            (into, " SELECT ", picks, " FROM jsonb_array_elements(?::jsonb) AS x(e)", tail)
        )

    return RowsSql(
        "".join((into, " VALUES (", values, ")", tail)),
        "".join(
            (
                into,
                " SELECT ",
                select,
                " FROM json_populate_recordset(NULL::",
                quoted(table),
                ", %s::json) AS v",
                tail,
            )
        ),
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
    head = "".join(("UPDATE ", quoted(table), " AS t SET ", _pairs("", columns, "v", ", ")))
    where = " WHERE " + _pairs("t", keys, "v", " AND ")

    def array_form(types: Mapping[str, str]) -> str:
        cast = _casts(names, types)
        picks = ", ".join(cast[n] + " AS " + quoted(n) for n in names)
        return "".join(
            (
                head,
                " FROM (SELECT ",
                picks,
                " FROM jsonb_array_elements(?::jsonb) AS x(e)) AS v",
                where,
            )
        )

    return RowsSql(
        "".join(
            (
                "UPDATE ",
                quoted(table),
                " SET ",
                _pairs("", columns, "?", ", "),
                " WHERE ",
                _pairs("", keys, "?", " AND "),
            )
        ),
        "".join(
            (
                head,
                " FROM json_populate_recordset(NULL::",
                quoted(table),
                ", %s::json) AS v",
                where,
            )
        ),
        names,
        table,
        array_form,
        columns=columns,
    )


def on_conflict_update(keys: Sequence[str], columns: Sequence[str]) -> str:
    """An insert's tail: ` ON CONFLICT (keys) DO UPDATE SET c = excluded.c, ...`."""
    return "".join(
        (" ON CONFLICT", _listed(keys), " DO UPDATE SET ", _pairs("", columns, "excluded", ", "))
    )


def on_conflict_add(table: str, keys: Sequence[str], column: str) -> str:
    """An insert's tail: ` ON CONFLICT (keys) DO UPDATE SET c = table.c + excluded.c`."""
    c = quoted(column)
    return "".join(
        (
            " ON CONFLICT",
            _listed(keys),
            " DO UPDATE SET ",
            c,
            " = ",
            quoted(table),
            ".",
            c,
            " + excluded.",
            c,
        )
    )
