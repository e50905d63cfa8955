"""`board(store, ...)`: one keyset page of runs with their delay signals, for operators.

Open runs by default (terminal ones only when asked), newest first or (`order="attention"`)
in the attention order of `ledger top` (`ledger.reads.attention`), filtered by state, by
who the run waits on and by whether it is stalled. The owner is computed (see
`ledger.reads.signals`), so an owner filter reads candidate runs a batch at a time until
the page is full: the cost is bounded by the open runs, never by the whole ledger. The
attention order ranks every matching run before it can page, so its pages are by rank
(`after` is the rank of the last run shown) and it reads every candidate run each time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.errors import InvalidInput
from ledger.core.rows import parse_dt
from ledger.core.views import Link, _View
from ledger.projections.counts import attach as attach_counts
from ledger.reads.attention import by_attention
from ledger.reads.signals import OWNERS, signals_for
from ledger.reads.sql import SQL

if TYPE_CHECKING:
    from ledger.stores.base import Store

MAX_LIMIT = 500
ORDERS: tuple[str, ...] = ("newest", "attention")
_BATCH = 200
_MAX_BATCHES = 25  # at most 5,000 runs read per filtered page


@dataclass(frozen=True)
class BoardRow(_View):
    """A run as an operator scans it: its state, counts and who owns its delay since when."""

    run_id: str
    seq: int
    state: str
    scope: str
    summary: str
    counts: dict[str, int]
    item_count: int
    failure_kind: str | None
    failure_reason: str | None
    cancel_requested: bool
    links: list[Link]
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    stopped_at: datetime | None
    stop_reason: str | None
    waiting_on: str
    waiting_on_actors: list[str]
    waiting_since: datetime | None
    last_activity_at: datetime | None
    stalled: bool
    rate: float
    eta: datetime | None
    expired_leases: int
    remaining_required: int
    can_succeed: bool
    next_step: str


@dataclass(frozen=True)
class BoardPage(_View):
    """A page of runs; `next_after` is the cursor of the next page (None on the last)."""

    runs: list[BoardRow] = field(default_factory=list)
    next_after: int | None = None


def board(
    store: Store,
    state: str | None = None,
    waiting_on: str | None = None,
    stalled: bool = False,
    terminal: bool = False,
    after: int | None = None,
    limit: int = 50,
    order: str = "newest",
) -> BoardPage:
    """Runs newest first after cursor `after` (or by attention, `order="attention"`): open
    ones, or terminal ones with `terminal` (a `state` picks one state of either kind)."""
    if order not in ORDERS:
        raise InvalidInput(f"order {order!r} is not one of {', '.join(ORDERS)}")
    if state is not None and state not in S.RUN_STATES:
        raise InvalidInput(f"state {state!r} is not a run state; states: {', '.join(S.RUN_STATES)}")
    if waiting_on is not None and waiting_on not in OWNERS:
        raise InvalidInput(f"waiting_on {waiting_on!r} is not one of {', '.join(OWNERS)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if after is not None and (
        isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63
    ):
        raise InvalidInput("after must be a non-negative cursor")
    # the state given (a parameter), else the terminal or the open states (queries.sql)
    states: tuple[str, ...] = () if state is None else (state,)
    name = "board_in_state" if state is not None else "board_terminal" if terminal else "board_open"
    filtered = waiting_on is not None or stalled
    if order == "attention":
        return _by_attention(store, name, states, waiting_on, stalled, after or 0, limit)
    out: list[BoardRow] = []
    cursor = after
    next_after: int | None = None
    with store.read() as tx:
        now = tx.now()
        for _ in range(_MAX_BATCHES):
            want = _BATCH if filtered else limit - len(out) + 1
            rows, matches = _batch(tx, name, states, cursor, want, now, waiting_on, stalled)
            for row in rows:
                if row["run_id"] in matches:
                    if len(out) == limit:  # one more match exists: the page is full
                        return BoardPage(out, out[-1].seq)
                    out.append(matches[row["run_id"]])
                cursor = int(row["seq"])
            if len(rows) < want:
                return BoardPage(out, None)
        # scanned enough for one request: the client goes on from the last run read
        next_after = cursor
    return BoardPage(out, next_after)


def _by_attention(
    store: Store,
    name: str,
    states: tuple[str, ...],
    waiting_on: str | None,
    stalled: bool,
    rank: int,
    limit: int,
) -> BoardPage:
    """Every matching run ranked by `attention.by_attention`; the page after rank `rank`."""
    found: list[BoardRow] = []
    cursor: int | None = None
    with store.read() as tx:
        now = tx.now()
        while True:
            rows, matches = _batch(tx, name, states, cursor, _BATCH, now, waiting_on, stalled)
            found.extend(matches.values())
            if len(rows) < _BATCH:
                break
            cursor = int(rows[-1]["seq"])
    found.sort(key=by_attention)
    page = found[rank : rank + limit]
    more = rank + limit < len(found)
    return BoardPage(page, rank + limit if more else None)


def _batch(
    tx: Any,
    name: str,
    states: tuple[str, ...],
    cursor: int | None,
    want: int,
    now: datetime,
    waiting_on: str | None,
    stalled: bool,
) -> tuple[list[dict[str, Any]], dict[str, BoardRow]]:
    """The next `want` runs of query `name` before `cursor` (newest first), and the board
    rows of those that match the filters, by run id (in the runs' order)."""
    rows = tx.fetchall(
        SQL.sql(tx, name if cursor is None else name + "_before"),
        (*states, *(() if cursor is None else (cursor,)), want),
    )
    attach_counts(tx, rows)
    signals = signals_for(tx, rows, now)
    matches: dict[str, BoardRow] = {}
    for row in rows:
        sig = signals[row["run_id"]]
        if (waiting_on is None or sig.waiting_on == waiting_on) and (not stalled or sig.stalled):
            matches[row["run_id"]] = _row(row, sig)
    return rows, matches


def _row(row: dict[str, Any], sig: Any) -> BoardRow:
    return BoardRow(
        run_id=row["run_id"],
        seq=int(row["seq"]),
        state=row["state"],
        scope=row["scope"],
        summary=row["summary"] or f"run {row['state']}",
        counts=json.loads(row["counts"]),
        item_count=int(row["item_count"]),
        failure_kind=row["failure_kind"],
        failure_reason=row["failure_reason"],
        cancel_requested=bool(row["cancel_requested"]),
        links=[Link(x["relation"], x["run_id"]) for x in json.loads(row["links"])],
        created_at=_dt(row["created_at"]),
        updated_at=_dt(row["updated_at"]),
        started_at=parse_dt(row["started_at"]),
        stopped_at=parse_dt(row["stopped_at"]),
        stop_reason=row["stop_reason"],
        remaining_required=sig.remaining_required,
        can_succeed=sig.can_succeed,
        next_step=sig.next_step,
        **sig.status_fields(),
    )


def _dt(text: str) -> datetime:
    value = parse_dt(text)
    assert value is not None
    return value
