"""Time travel: a run's status as the store had accepted it at a past time.

The run's stream, its items' streams, and the creating events of runs linked to
it (retries, repairs, compensations add reverse links) are read, the events
stamped at or before `at` are kept, and they are replayed, in position order,
through the same aggregates and `Projector` the live commands use, into private
in-memory projection tables, beside their transition columns as the log holds them. The status is then read from those tables with the
same code `Ledger.status` uses, so it equals what `status()` returned then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import StoredEvent

from ledger.core.domain import Run, item_stream_id
from ledger.core.errors import RunNotFound
from ledger.core.recorded import columns
from ledger.core.views import RunStatus
from ledger.projections.rebuild import Replayer
from ledger.projections.schema import table_ddl
from ledger.reads.queries import status_tx
from ledger.reads.sql import SQL
from ledger.stores.base import Store, Tx
from ledger.stores.hashchain import as_uuid, oid_param
from ledger.stores.named import tx_list

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

_CHUNK = 400


class MemoryTables:
    """Projection tables in a private in-memory SQLite database (a minimal Tx)."""

    store = SimpleNamespace(dialect="sqlite")

    def __init__(self, now: datetime | None = None) -> None:
        self._now = now
        self.conn = sqlite3.connect(":memory:")
        self.conn.row_factory = sqlite3.Row
        self.cur = self.conn.cursor()
        for sql in table_ddl("sqlite"):
            self.cur.execute(sql)
        self.cur.execute(SQL.sql("sqlite", "memory_events"))
        self.cur.execute(SQL.sql("sqlite", "memory_transitions"))

    def add_transitions(self, events: Sequence[tuple[int, DomainEvent]]) -> None:
        """The events' transition columns (ledger/core/recorded.py), at their positions:
        what the store's log holds of them (no state: the signals never read it)."""
        rows = []
        for position, e in events:
            found = columns(e)
            if found is not None:
                rows.append((position, e.originator_version, "", b"", *found))
        self.cur.executemany(SQL.sql("sqlite", "memory_insert_event"), rows)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        return self.cur.executemany(sql, rows)

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.cur.execute(sql, params).fetchall()]

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    def now(self) -> datetime:
        """The clock the status's delay signals are judged by (the replay's last change)."""
        assert self._now is not None
        return self._now

    def close(self) -> None:
        self.cur.close()
        self.conn.close()


def read_streams(
    tx: Tx, stream_ids: Sequence[UUID], first_only: bool = False
) -> list[tuple[int, DomainEvent]]:
    """Every event of the given streams (or only their first), decoded, in position order."""
    store: Store = tx.store
    out: list[tuple[int, DomainEvent]] = []
    for i in range(0, len(stream_ids), _CHUNK):
        chunk = stream_ids[i : i + _CHUNK]
        sql = SQL.sql(tx, "stream_first_events" if first_only else "stream_events")
        for r in tx.fetchall(sql, (tx_list(tx, [oid_param(store.dialect, s) for s in chunk]),)):
            stored = StoredEvent(
                originator_id=as_uuid(r["originator_id"]),
                originator_version=r["originator_version"],
                topic=r["topic"],
                state=bytes(r["state"]),
            )
            out.append(
                (int(r["position"]), cast(DomainEvent, store.mapper.to_domain_event(stored)))
            )
    out.sort(key=lambda t: t[0])
    return out


def status_at(lg: Ledger, run_id: str, at: datetime) -> RunStatus:
    """The run's status as accepted at time `at` (RunNotFound if it did not exist yet)."""
    with lg.store.read() as tx:
        row = tx.fetchone(SQL.sql(tx, "run_and_root"), (run_id,))
        if row is None:
            raise RunNotFound(run_id)
        item_ids = [r["item_id"] for r in tx.fetchall(SQL.sql(tx, "item_ids"), (run_id,))]
        linked = [
            UUID(r["run_id"])
            for r in tx.fetchall(SQL.sql(tx, "linked_runs"), (row["root_run_id"], run_id))
        ]
        events = read_streams(tx, [UUID(run_id)] + [item_stream_id(run_id, i) for i in item_ids])
        events += [
            (p, e)
            for p, e in read_streams(tx, linked, first_only=True)
            if any(link["run_id"] == run_id for link in getattr(e, "links", ()))
        ]
    events = sorted(((p, e) for p, e in events if e.timestamp <= at), key=lambda t: t[0])
    if not any(isinstance(e, Run.Submitted) and e.run_id == run_id for _p, e in events):
        raise RunNotFound(run_id, f"run {run_id!r} did not exist yet at {at.isoformat()}")
    # The delay signals (rule 19) as of the last change accepted by then: the status a
    # reader saw right after that change, and the same at any instant until the next one.
    tables = MemoryTables(now=max(e.timestamp for _p, e in events))
    try:
        tables.add_transitions(events)
        Replayer("").apply(tables, events)  # type: ignore[arg-type]
        status: RunStatus = status_tx(tables, run_id)  # type: ignore[arg-type]
        return status
    finally:
        tables.close()
