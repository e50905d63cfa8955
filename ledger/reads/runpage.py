"""One run as its operator page shows it: its board row, and its items and attempts one
keyset page at a time (a 5,000-item run costs one page per refresh, not the whole run).

Leases past their expiry that the reconciler has not expired yet are marked
`lease_expired` here, by the store's clock, so the page never shows a dead lease as
live nor judges expiry by the browser's clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.errors import InvalidInput, RunNotFound
from ledger.core.rows import iso, parse_dt
from ledger.core.views import _View
from ledger.projections.counts import attach as attach_counts
from ledger.reads.board import BoardRow, _row
from ledger.reads.signals import signals_for
from ledger.reads.sql import SQL

if TYPE_CHECKING:
    from ledger.stores.base import Store, Tx

MAX_LIMIT = 500
# the attempts a page counts at most: the count reads one index entry per attempt, so
# an uncapped count read every attempt of the run at each refresh (200,000 rows on a
# 200,000-item run, 61 ms on PostgreSQL; capped: 1,001 rows, 0.5 ms); past the cap the
# page says "1000+"
ATTEMPT_COUNT_CAP = 1000


@dataclass(frozen=True)
class ItemRow(_View):
    """An item with its live or expired lease."""

    item_id: str
    seq: int
    state: str
    required: bool
    attempts: int
    lease_worker: str | None
    lease_expires_at: datetime | None
    lease_expired: bool
    reason: str | None
    last_error: str | None
    updated_at: datetime | None


@dataclass(frozen=True)
class AttemptRow(_View):
    """An attempt; `outcome` None and `lease_expired` means its worker is gone, unreconciled."""

    item_id: str
    attempt: int
    worker_id: str
    started_at: datetime
    expires_at: datetime
    finished_at: datetime | None
    stage: str | None
    outcome: str | None
    error: str | None
    lease_expired: bool
    cursor: str


@dataclass(frozen=True)
class ItemPage(_View):
    """A page of a run's items in manifest order; `next_after` is the next page's cursor."""

    at: datetime
    total: int
    items: list[ItemRow] = field(default_factory=list)
    next_after: int | None = None


@dataclass(frozen=True)
class AttemptPage(_View):
    """A page of a run's attempts, newest first; `next_after` is the next page's cursor.
    `total` counts the run's attempts up to ATTEMPT_COUNT_CAP; `total_capped` says the run
    has more (so a refresh never counts every attempt of a large run)."""

    at: datetime
    total: int
    attempts: list[AttemptRow] = field(default_factory=list)
    next_after: str | None = None
    total_capped: bool = False


def _check(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")


def _run_exists(tx: Tx, run_id: str) -> dict[str, Any]:
    row: dict[str, Any] | None = tx.fetchone(SQL.sql(tx, "board_run"), (run_id,))
    if row is None:
        raise RunNotFound(run_id)
    attach_counts(tx, [row])
    return row


def board_row(store: Store, run_id: str) -> BoardRow:
    """One run's board row (its state, counts and delay signals)."""
    with store.read() as tx:
        row = _run_exists(tx, run_id)
        return _row(row, signals_for(tx, [row], tx.now())[row["run_id"]])


def item_page(
    store: Store, run_id: str, state: str | None = None, after: int | None = None, limit: int = 100
) -> ItemPage:
    """The run's items after cursor `after` (manifest order), optionally in one state."""
    _check(limit)
    if state is not None and state not in S.ITEM_STATES:
        raise InvalidInput(
            f"state {state!r} is not an item state; states: {', '.join(S.ITEM_STATES)}"
        )
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        raise InvalidInput("after must be a non-negative cursor")
    with store.read() as tx:
        run = _run_exists(tx, run_id)
        now = tx.now()
        name = "run_items_page" if state is None else "run_items_page_in_state"
        params: list[Any] = [run_id, *(() if state is None else (state,))]
        counts = json.loads(run["counts"])
        total = int(counts.get(state, 0)) if state is not None else int(run["item_count"])
        rows = tx.fetchall(
            SQL.sql(tx, name if after is None else name + "_after"),
            (*params, *(() if after is None else (after,)), limit + 1),
        )
    now_text = iso(now)
    out = []
    for r in rows[:limit]:
        live = r["state"] == S.IN_PROGRESS
        expires = r["lease_expires_at"] if live else None
        out.append(
            ItemRow(
                item_id=r["item_id"],
                seq=int(r["seq"]),
                state=r["state"],
                required=bool(r["required"]),
                attempts=int(r["attempts"]),
                lease_worker=r["lease_worker"] if live else None,
                lease_expires_at=parse_dt(expires),
                lease_expired=bool(expires and now_text and expires < now_text),
                reason=r["reason"],
                last_error=r["last_error"],
                updated_at=parse_dt(r["updated_at"]),
            )
        )
    return ItemPage(now, total, out, out[-1].seq if len(rows) > limit else None)


def attempt_page(
    store: Store, run_id: str, after: str | None = None, limit: int = 50
) -> AttemptPage:
    """The run's attempts newest first, after cursor `after` (an attempt's `cursor`)."""
    _check(limit)
    key: tuple[str, str, int] | None = None
    if after is not None:
        started, sep, rest = after.partition("|")
        item_id, sep2, attempt = rest.rpartition("|")
        if not (sep and sep2 and attempt.isdigit() and parse_dt_or_none(started)):
            raise InvalidInput("after must be an attempt's cursor (STARTED|ITEM|ATTEMPT)")
        key = (started, item_id, int(attempt))
    with store.read() as tx:
        _run_exists(tx, run_id)
        now = tx.now()
        total_row = tx.fetchone(
            SQL.sql(tx, "run_attempts_counted"), (run_id, ATTEMPT_COUNT_CAP + 1) * 2
        )
        part = (run_id, *(key or ()))
        rows = tx.fetchall(
            SQL.sql(tx, "run_attempts_newest" if key is None else "run_attempts_newest_before"),
            (*part, limit + 1, *part, limit + 1, limit + 1),
        )
    now_text = iso(now) or ""
    out = [
        AttemptRow(
            item_id=r["item_id"],
            attempt=int(r["attempt"]),
            worker_id=r["worker_id"],
            started_at=_dt(r["started_at"]),
            expires_at=_dt(r["expires_at"]),
            finished_at=parse_dt(r["finished_at"]),
            stage=r["stage"],
            outcome=r["outcome"],
            error=r["error"],
            lease_expired=r["finished_at"] is None and r["expires_at"] < now_text,
            cursor=f"{r['started_at']}|{r['item_id']}|{r['attempt']}",
        )
        for r in rows[:limit]
    ]
    total = int(total_row["n"]) if total_row else 0
    capped = total > ATTEMPT_COUNT_CAP
    return AttemptPage(
        now,
        min(total, ATTEMPT_COUNT_CAP),
        out,
        out[-1].cursor if len(rows) > limit else None,
        capped,
    )


def parse_dt_or_none(text: str) -> datetime | None:
    """`text` as a datetime, or None when it is not one."""
    try:
        return parse_dt(text)
    except ValueError:
        return None


def _dt(text: str) -> datetime:
    value = parse_dt(text)
    assert value is not None
    return value
