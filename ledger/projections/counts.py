"""A run's item counts per state, kept off its `lg_runs` row while the run is open.

On PostgreSQL the item commands (claim, heartbeat, accept, reject, fail_attempt, record)
hold the run's row `FOR SHARE` while the run is running, so many workers write at once:
none of them may rewrite that row (an UPDATE needs a lock that conflicts with every other
holder's share lock). The counts of a run that is not terminal therefore live in
`lg_run_counts(run_id, slot, state, n)`: signed deltas, one row per slot and state. Each
item transition adds -1 to its from-state and +1 to its to-state in the slot of its own
event time (`slot_of`: the microseconds of the event's stamp, mod 64), a submit or an
amend's added items add to `pending` in theirs. One transaction's events share one stamp,
so a commit touches one slot, and workers committing at once touch different rows (a
per-worker slot was the other candidate; several processes of one worker id would then
share a row). A slot's count may go negative; the sum per state is the count. When the
run ends (or is archived) its totals move into the `counts` column of its row, written by
that run event anyway, and its slot rows are deleted; while it is open that column is
`{}`. The slot is a function of the event alone, and every touched (slot, state) keeps
its row even at zero, so a rebuild, in whatever batches it replays the events, writes the
same rows (rule 10 of the rule book), and schema v7 can compute them from `lg_transitions` in SQL.

Deriving the counts at read time from `lg_items` (`SELECT state, count(*) ... GROUP BY
state`) needs no table, but costs every status read a pass over all of the run's items
and their dead versions. Measured on PostgreSQL 15 (a 20,000-item run, 8 workers'
claims and accepts, no vacuum since): 8.4 ms median per read from lg_items (37,180
tuples visited) against 0.22 ms for the slot rows (97 rows) read with the run's row;
the slot rows stay at most 64 per state however large the run. Whatever an item command decides from counts (the last live
lease of a pausing or canceling run ending) it decides holding the run row FOR UPDATE,
so no concurrent writer can move them meanwhile.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, cast

from ledger.core.states import ITEM_STATES
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import Tx
from ledger.stores.named import tx_list

SLOTS = 64
_CHUNK = 500


class Reader(Protocol):
    store: Any

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...


def slot_of(at: str) -> int:
    """The slot of an event stamped `at` (projections.rows.iso text: its microseconds)."""
    return int(at[20:26]) % SLOTS


def total(column: Any, delta: Counter[str] | None) -> dict[str, int]:
    """Every item state's count: the row's `counts` column plus the slot deltas."""
    base = json.loads(column) if isinstance(column, str) else dict(column or {})
    delta = delta or Counter()
    return {s: int(base.get(s, 0)) + delta.get(s, 0) for s in ITEM_STATES}


def attach(tx: Reader, rows: Sequence[dict[str, Any]], suffix: str = "") -> None:
    """Replace the `counts` of each lg_runs row (JSON text) by the run's true counts.

    The row's column and the slot rows are read again together, in one statement (one
    snapshot): a run that ended between the row's read and this one has moved its slot
    rows into its column, and reading them apart could see neither."""
    sql = STATEMENTS.sql(
        tx.store.dialect, "run_counts", runs="lg_runs" + suffix, counts="lg_run_counts" + suffix
    )
    ids = list(dict.fromkeys(r["run_id"] for r in rows))
    base: dict[str, Any] = {}
    found: dict[str, Counter[str]] = {}
    for k in range(0, len(ids), _CHUNK):
        for r in tx.fetchall(sql, (tx_list(cast(Tx, tx), ids[k : k + _CHUNK]),)):
            base[r["run_id"]] = r["counts"]
            if r["state"] is not None:
                found.setdefault(r["run_id"], Counter())[r["state"]] += int(r["n"])
    for r in rows:
        r["counts"] = json.dumps(
            total(base.get(r["run_id"], r["counts"]), found.get(r["run_id"])),
            sort_keys=True,
            separators=(",", ":"),
        )


def required_not_accepted(
    tx: Tx, run_id: str, limit: int, items_table: str = "lg_items"
) -> list[dict[str, Any]]:
    """The first `limit` required items of the run's manifest not accepted, in manifest
    order (`item_id`, `state`): what a succeeded run must not have. Asked for the rule
    checker (`ledger/core/rule_check.py`) before commit and over history (on a replay's
    copy of the item rows: `items_table`)."""
    return tx.fetchall(
        STATEMENTS.sql(tx, "required_not_accepted", items=items_table), (run_id, limit)
    )
