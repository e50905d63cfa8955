"""The transitions in the shape of the schema versions before 17, for tests that write a
database with this release and then make it look older (tests/stores/*_migration.py):
`transitions_on_the_log` before this release writes at an older version,
`transitions_as_table` after, to put the transitions back into their own table."""

from __future__ import annotations

from typing import Any

from ledger.core.recorded import TRANSITION_COLUMNS, decode_recorded
from ledger.core.rows import dumps
from ledger.stores.migrations import steps

ASIDE = "lg_transitions_before_v17"


def _events(dialect: str) -> tuple[str, str, str]:
    """The events table, its position column and the parameter mark."""
    if dialect == "postgres":
        return "ledger_events", "notification_id", "%s"
    return "stored_events", "rowid", "?"


def _v17(dialect: str, start: str) -> list[str]:
    return [s for s in steps(dialect)[16] if s.startswith(start)]


def transitions_on_the_log(execute: Any, dialect: str) -> None:
    """A database at a version before 17, made writable by this release: its transition
    table set aside (emptied: it is filled again by `transitions_as_table`), the columns
    and the view of v17 added."""
    ev, _pos, _mark = _events(dialect)
    execute(f"ALTER TABLE lg_transitions RENAME TO {ASIDE}")
    for column in TRANSITION_COLUMNS:
        execute(f"ALTER TABLE {ev} ADD COLUMN {column} TEXT")
    for statement in _v17(dialect, "CREATE VIEW"):
        execute(statement)


def transitions_as_table(execute: Any, dialect: str) -> None:
    """The shape of the versions before 17: every transition a row of `lg_transitions`
    (the table `transitions_on_the_log` set aside, or, when there is none, the table and
    indexes of v1), its reason and evidence as the projector wrote them; no transition
    columns or view on the log."""
    ev, pos, mark = _events(dialect)
    names = ", ".join(TRANSITION_COLUMNS)
    rows = execute(
        f"SELECT {pos}, {names}, originator_version, topic, state FROM {ev} "  # noqa: S608 (test's own SQL)
        "WHERE run_id IS NOT NULL"
    ).fetchall()
    execute("DROP VIEW lg_transitions")
    for statement in _v17(dialect, "CREATE INDEX"):
        execute("DROP INDEX IF EXISTS " + statement.split()[5])
    for column in TRANSITION_COLUMNS:
        execute(f"ALTER TABLE {ev} DROP COLUMN {column}")
    aside = execute(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = %s"
        if dialect == "postgres"
        else "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
        (ASIDE,),
    ).fetchone()[0]
    if aside:
        execute(f"ALTER TABLE {ASIDE} RENAME TO lg_transitions")
    else:
        for statement in steps(dialect)[0]:
            if "lg_transitions" in statement.split("(")[0]:
                execute(statement)
    marks = ", ".join([mark] * 13)
    for r in rows:
        position, run_id, item_id, command, from_state, to_state, actor_id, role, at = r[:9]
        version, topic, state = r[9:]
        reason, evidence = decode_recorded((topic, bytes(state)))
        execute(
            "INSERT INTO lg_transitions (position, ord, run_id, item_id, command, from_state, "  # noqa: S608 (test's own SQL)
            f"to_state, actor_id, role, reason, evidence, at, revision) VALUES ({marks})",
            (
                position,
                0,
                run_id,
                item_id,
                command,
                from_state,
                to_state,
                actor_id,
                role,
                reason,
                dumps(evidence),
                at,
                version,
            ),
        )
