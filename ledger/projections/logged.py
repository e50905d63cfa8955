"""The transition columns on the event log's rows, checked against the events.

Each transition's columns are written with its event (ledger/core/recorded.py), so they
are derived data like a projection's rows, only kept on the log itself: `verify`
reports a row whose columns disagree with its event (`transition_columns`), and a
rebuild writes them again from the events (a database whose columns were never
written, or were edited, is put right by `rebuild_projections`, as a projection table
is). The event's bytes and hash are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.domain import DomainEvent

from ledger.core.recorded import TRANSITION_COLUMNS, columns
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import NO_TRANSITION, Tx

Columns = tuple[str | None, ...]


def of_events(events: Sequence[tuple[int, DomainEvent]]) -> list[tuple[int, Columns]]:
    """(position, the columns the event says) of each event (NO_TRANSITION for an event
    that is no transition)."""
    return [(position, columns(e) or NO_TRANSITION) for position, e in events]


def mismatched(tx: Tx, logged: Sequence[tuple[int, Columns]]) -> list[tuple[int, Columns, Columns]]:
    """(position, the columns the event says, the columns its row holds) of each event of
    `logged` ((position, the event's columns), in position order) whose row disagrees
    with it: one read of the range."""
    if not logged:
        return []
    stored: dict[int, Columns] = {
        int(r[0]): tuple(r[1:])
        for r in tx.fetch_rows(
            STATEMENTS.sql(tx, "logged_transitions"), (logged[0][0] - 1, logged[-1][0])
        )
    }
    out = []
    for position, want in logged:
        have = stored.get(position, NO_TRANSITION)
        if want != have:
            out.append((position, tuple(want), have))
    return out


def rewrite(tx: Tx, logged: Sequence[tuple[int, Columns]]) -> int:
    """Write the columns of each event of `logged` ((position, the event's columns))
    whose row disagrees with them; returns how many rows were written."""
    wrong = mismatched(tx, logged)
    if wrong:
        tx.executemany(
            STATEMENTS.sql(tx, "set_logged_transition"),
            [(*want, position) for position, want, _have in wrong],
        )
    return len(wrong)


def describe(want: Columns, have: Columns) -> dict[str, Any]:
    """The differing columns, by name: (on the row, from the event)."""
    return {
        name: [h, w] for name, w, h in zip(TRANSITION_COLUMNS, want, have, strict=True) if w != h
    }
