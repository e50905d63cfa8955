"""Named SQL statements: each room that talks to the database keeps its statements in one
`.sql` file beside its modules (`ledger/reads/queries.sql`, ...), in blocks that each
start with a `-- name: NAME` line, as procrastinate and aiosql keep theirs.

A block is SQL with `?` placeholders for every value. What differs between the stores,
or comes from the rule tables, is a `{slot}` filled by name when the statement is first
asked for on a dialect (then cached):

- the dialect's slots (`DIALECT_SLOTS`): `{events}` the events table, `{position}` its
  position column, `{lock}` and `{claim_lock}` the row-lock clauses, `{now_column}` and
  `{readable_column}` the extra columns PostgreSQL reads in the same statement,
  `{in_list}` a membership test against one bound list (`tx_list(tx, values)`);
- the rule tables' slots (`rule_slots()`): every state name as a quoted literal
  (`{s_pending}`, `{s_running}`, ...) and the state sets of `ledger.core.states`
  as lists of literals (`{terminal_run_states}`, `{open_run_states}`, ...);
- a block may also be written for one store only, under `-- name: NAME postgres` (or
  `sqlite`): that store reads it instead of the common block of the same name, where
  the same result needs another shape there (a search the planner must not choose
  from a new run's statistics, say);
- identifiers chosen at run time (a scratch table of verify) as keyword arguments of
  `Statements.sql`, quoted as identifiers by the dialect (PostgreSQL through
  `psycopg.sql.Identifier`), never spliced as text.

Values are never formatted into SQL: they are bound parameters. The one place text is
put together is `render`, from the fixed slots above. Statements generated from our own
column lists (ledger/stores/statements.py) join identifiers quoted by `quoted` and
types checked by `sql_type`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ledger.core import states as S

if TYPE_CHECKING:
    from ledger.stores.base import Tx

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)(?:\s+(sqlite|postgres))?\s*$", re.MULTILINE)
_SLOT = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

DIALECTS = ("sqlite", "postgres")
_IDENT_CACHE = 256  # statements rendered with identifiers kept per `Statements`

# What differs between the stores, by name.
DIALECT_SLOTS: dict[str, dict[str, str]] = {
    "sqlite": {
        "events": '"stored_events"',
        "position": "rowid",
        "lock": "",
        "claim_lock": "",
        "now_column": "",
        "readable_column": "",
        "in_list": "IN (SELECT value FROM json_each(?))",
    },
    "postgres": {
        "events": '"ledger_events"',
        "position": "notification_id",
        "lock": "FOR UPDATE",
        "claim_lock": "FOR UPDATE SKIP LOCKED",
        "now_column": ", clock_timestamp() AS db_now",
        "readable_column": ", ledger_readable_position() AS readable",
        "in_list": "= ANY(?)",
    },
}


def literal(value: str) -> str:
    """A state name as an SQL string literal (names are `[a-z_]+`; checked)."""
    if not re.fullmatch(r"[a-z_]+", value):
        raise ValueError(f"not a state name: {value!r}")
    return f"'{value}'"


def literals(values: Sequence[str] | frozenset[str]) -> str:
    """A set of state names as a list of SQL literals, in a stable order."""
    return ", ".join(literal(v) for v in sorted(values))


@cache
def rule_slots() -> dict[str, str]:
    """The rule tables' slots: each state as `{s_NAME}`, the state sets by name."""
    out = {f"s_{state}": literal(state) for state in (*S.RUN_STATES, *S.ITEM_STATES)}
    out.update({f"r_{role}": literal(role) for role in S.ROLES})  # each role: `{r_worker}`, ...
    out.update(
        terminal_run_states=literals(S.TERMINAL_RUN_STATES),
        open_run_states=literals(S.OPEN_RUN_STATES),
        final_item_states=literals(S.FINAL_ITEM_STATES),
        not_accepted_finals=literals(S.NOT_ACCEPTED_FINALS),
    )
    return out


def ident(dialect: str, name: str) -> str:
    """A table or column name chosen at run time, quoted as an identifier."""
    if dialect == "postgres":
        from psycopg import sql

        return sql.Identifier(name).as_string(None)
    return quoted(name)


def quoted(name: str) -> str:
    """A table or column name quoted as the SQL standard quotes identifiers (double quotes,
    a quote inside doubled), which both stores read alike: for statement texts written
    once for every store from column lists (ledger/stores/statements.py)."""
    return '"' + name.replace('"', '""') + '"'


_TYPE = re.compile(r"[a-z_][a-z0-9_ ]*(\(\d+(,\d+)?\))?[a-z ]*(\[\])*")


def sql_type(name: str) -> str:
    """A column type as PostgreSQL's `format_type` spells it (`integer`, `text`,
    `timestamp(3) with time zone`, `character varying(20)[]`), for a cast; checked, since
    a type name cannot be quoted as an identifier (`"integer"` is no type)."""
    if not _TYPE.fullmatch(name):
        raise ValueError(f"not a type name: {name!r}")
    return name


def render(dialect: str, text: str, idents: Mapping[str, str] | None = None) -> str:
    """`text` with its slots filled: the dialect's, the rule tables', then `idents`
    (quoted as identifiers). An unknown slot is an error, never left in the SQL."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    fixed = DIALECT_SLOTS[dialect]
    rules = rule_slots()
    given = idents or {}

    def fill(m: re.Match[str]) -> str:
        slot = m.group(1)
        if slot in given:
            return ident(dialect, given[slot])
        if slot in fixed:
            return fixed[slot]
        if slot in rules:
            return rules[slot]
        raise KeyError(f"SQL slot {{{slot}}} is not a dialect, rule or identifier slot")

    return _SLOT.sub(fill, text)


def parse(text: str) -> dict[str, str]:
    """The named blocks of a `.sql` file: `{name: SQL}` (each block's text up to the next
    `-- name:` line; comment lines inside a block are kept, trailing `;` dropped). A
    block for one store only is keyed `NAME postgres` (or `NAME sqlite`), and needs the
    common block `NAME` in the same file."""
    heads = list(_NAME.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[m.end() : end].strip().rstrip(";").strip()
        key = m.group(1) if m.group(2) is None else f"{m.group(1)} {m.group(2)}"
        if key in out:
            raise ValueError(f"SQL block {key!r} is named twice")
        if not body:
            raise ValueError(f"SQL block {key!r} is empty")
        out[key] = body
    for key in out:
        if " " in key and key.split(" ")[0] not in out:
            raise ValueError(f"SQL block {key!r} has no common block of its name")
    return out


class Statements:
    """The named statements of one `.sql` file of a package, rendered per dialect."""

    def __init__(self, package: str, filename: str) -> None:
        self.package = package
        self.filename = filename
        self._blocks: dict[str, str] | None = None
        self._rendered: dict[tuple[str, str], str] = {}
        # with identifiers: bounded (verify names new scratch tables on every run)
        self._with_idents: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}

    @property
    def blocks(self) -> dict[str, str]:
        """The file's blocks as written (slots unfilled), read on first use."""
        if self._blocks is None:
            text = resources.files(self.package).joinpath(self.filename).read_text("utf-8")
            self._blocks = parse(text)
        return self._blocks

    def names(self) -> list[str]:
        """The statements' names (a block for one store only is not another name)."""
        return sorted(name for name in self.blocks if " " not in name)

    def sql(self, dialect: str | Tx, name: str, **idents: str) -> str:
        """Statement `name` for a dialect (or a transaction's store's dialect)."""
        if not isinstance(dialect, str):
            dialect = dialect.store.dialect
        blocks = self.blocks
        text = blocks.get(f"{name} {dialect}") or blocks.get(name)
        if text is None or " " in name:
            raise KeyError(f"no SQL block {name!r} in {self.package}/{self.filename}")
        if idents:
            ikey = (dialect, name, tuple(sorted(idents.items())))
            hit = self._with_idents.get(ikey)
            if hit is None:
                if len(self._with_idents) >= _IDENT_CACHE:
                    self._with_idents.clear()
                hit = self._with_idents[ikey] = render(dialect, text, idents)
            return hit
        key = (dialect, name)
        out = self._rendered.get(key)
        if out is None:
            out = self._rendered[key] = render(dialect, text)
        return out

    def common(self, name: str, **idents: str) -> str:
        """Statement `name` where it is the same text on every store (it uses no dialect
        slot; identifiers quoted the standard way, `quoted`): for statements made before
        any store is known (the projector's, ledger/projections/writer.py)."""
        text = self.blocks.get(name)
        if text is None or " " in name:
            raise KeyError(f"no SQL block {name!r} in {self.package}/{self.filename}")
        if any(f"{name} {dialect}" in self.blocks for dialect in DIALECTS):
            raise ValueError(f"SQL block {name!r} differs between the stores (own blocks)")
        used = [slot for slot in _SLOT.findall(text) if slot in DIALECT_SLOTS["sqlite"]]
        if any(slot not in idents for slot in used):
            raise ValueError(f"SQL block {name!r} differs between the stores ({used})")
        return self.sql("sqlite", name, **idents) if idents else self.sql("sqlite", name)


def tx_list(tx: Tx, values: Sequence[Any]) -> Any:
    """The one parameter of an `{in_list}` slot: a list on PostgreSQL (an array), JSON
    text on SQLite (read by `json_each`)."""
    if tx.store.dialect == "postgres":
        return list(values)
    return json.dumps(list(values))


__all__ = [
    "DIALECTS",
    "DIALECT_SLOTS",
    "Statements",
    "ident",
    "literal",
    "literals",
    "parse",
    "quoted",
    "render",
    "rule_slots",
    "sql_type",
    "tx_list",
]
