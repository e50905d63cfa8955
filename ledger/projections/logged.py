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
from eventsourcing.persistence import StoredEvent

from ledger.core.recorded import TRANSITION_COLUMNS, columns
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import NO_TRANSITION, Tx
from ledger.stores.encoding import stored_event

Columns = tuple[str | None, ...]


def of_events(events: Sequence[tuple[int, DomainEvent]]) -> list[tuple[int, Columns]]:
    """(position, the columns the event says) of each event (NO_TRANSITION for an event
    that is no transition)."""
    return [(position, columns(e) or NO_TRANSITION) for position, e in events]


class LoggedPages:
    """Reads pages of stored events together with the transition columns their rows hold
    (one statement: `read_logged`), and keeps those columns by position until `take`n,
    so the columns are checked against the events with no second read of the range.
    One serves one transaction (its readable bound is that transaction's).

    On PostgreSQL that second read also waited for every row the page had just sent
    (a pipelined transaction answers in order), so the server's writing of one page no
    longer overlapped the client's projecting of the next."""

    def __init__(self) -> None:
        self.held: dict[int, Columns] = {}
        self._bound: int | None = None
        self._bounded = False  # whether `_bound` was read (None: every position is readable)

    def __call__(self, tx: Tx, after: int, limit: int) -> list[tuple[int, StoredEvent]]:
        """The stored rows of up to `limit` events after position `after` (as
        `Store.read_stored_rows`), their rows' columns held.

        Never past the readable position (ledger/stores/pg_positions.py), read before the
        first page and kept for the next ones of the transaction (a bound once read stays
        a bound); read again, and the page with it, only when it cuts a page short. It is
        applied here, not in the statement: with it there, PostgreSQL's planner (the
        table's statistics older than its rows, as after a bulk load) chose a bitmap scan
        of the whole range up to the bound and a sort of it, spilled to disk, for each
        page (measured: 5x the read); without it, the index in order."""
        if not self._bounded:
            self._bound, self._bounded = tx.readable_position(), True
        sql = STATEMENTS.sql(tx, "read_logged")
        rows = tx.fetch_rows(sql, (after, limit))
        if self._bound is not None and rows and rows[-1][0] > self._bound:
            # a new bound must be read before the read it bounds: both again
            self._bound = tx.readable_position()
            rows = tx.fetch_rows(sql, (after, limit))
            bound = self._bound
            if bound is not None and rows and rows[-1][0] > bound:
                rows = [r for r in rows if r[0] <= bound]
        out: list[tuple[int, StoredEvent]] = []
        held = self.held
        for r in rows:
            position, state = r[0], r[4]
            out.append(
                (
                    position,
                    _stored(r[1], r[2], r[3], state if type(state) is bytes else bytes(state)),
                )
            )
            # a row with no run id holds no transition
            held[position] = NO_TRANSITION if r[5] is None else tuple(r[5:13])
        return out

    def take(self, positions: Sequence[tuple[int, Any]]) -> dict[int, Columns]:
        """The held columns of the rows at `positions` ((position, ...) pairs), no longer held."""
        pop = self.held.pop
        return {p: pop(p, NO_TRANSITION) for p, _ in positions}


# A StoredEvent of a row's values. The stream id stays as the store holds it (SQLite: its
# text), made a UUID by the mapper only for an event it decodes; a fold never reads it.
_stored = stored_event


def mismatched(
    logged: Sequence[tuple[int, Columns]], stored: dict[int, Columns]
) -> list[tuple[int, Columns, Columns]]:
    """(position, the columns the event says, the columns its row holds) of each event of
    `logged` ((position, the event's columns), in position order) whose row disagrees
    with it: the rows' columns as `stored` gives them (`LoggedPages.take`)."""
    out = []
    for position, want in logged:
        have = stored.get(position, NO_TRANSITION)
        if want != have:
            out.append((position, tuple(want), have))
    return out


def rewrite(tx: Tx, logged: Sequence[tuple[int, Columns]], stored: dict[int, Columns]) -> int:
    """Write the columns of each event of `logged` ((position, the event's columns))
    whose row disagrees with them (`stored`: the rows' columns, as `mismatched`);
    returns how many rows were written."""
    wrong = mismatched(logged, stored)
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
