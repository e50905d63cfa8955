"""Who owns a run's delay, precisely (rules 9 and 19 of the rule book), computed from the projections.

For a batch of `lg_runs` rows, a handful of indexed queries give each open run:
- `waiting_on`: the rule-9 owner of its state, except `reconciler` when a lease has
  expired and nobody has reconciled it yet (the item looks in flight, but its worker is gone),
  or was granted by a clock that has since stepped back (it expires more than the run's
  `lease_seconds` ahead: the next reconcile pass ends it, and no worker can claim it before);
- `waiting_on_actors`: the person where one is known (the reviewer a review is routed
  to, the workers holding live leases);
- `waiting_since`: when that owner started owning the delay;
- `last_activity_at`: the latest run *or item* transition (a run busy with items is
  active even when its own state has not changed for hours);
- `stalled`: waiting on workers with no activity for `policy.stall_seconds` (900 s);
- `rate`: items finished (accepted, rejected, skipped) per minute over the last 5 minutes,
  and `eta`: remaining required items / rate, only for a running run that can still
  succeed (`ledger.reads.attention.can_succeed`);
- `next_step`: what the owner has to do (the rule book's NEXT_STEP table).

Every query is bounded by the batch (the run index, the item state index, the
transition run index), so a page of runs costs the same however large the ledger is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.rows import iso, parse_dt
from ledger.reads.attention import can_succeed
from ledger.reads.queries import waiting_on as base_waiting_on
from ledger.reads.sql import SQL
from ledger.stores.named import tx_list

if TYPE_CHECKING:
    from ledger.stores.base import Tx

DEFAULT_STALL_SECONDS = 900.0
DEFAULT_LEASE_SECONDS = 60.0  # the manifest's default
RATE_WINDOW_SECONDS = 300.0
# Owners whose delay is a person's (or a process's) decision, in the order the overview lists them.
OWNERS: tuple[str, ...] = ("reconciler", "reviewer", "operator", "controller", "workers", "nobody")
# Item states that still need a worker before the run can finish.
# the open item states (as written in queries.sql, run_signals: optional_open)
_REMAINING = (S.PENDING, S.IN_PROGRESS, S.RETRYABLE)
_MAX_ACTORS = 5
_BATCH = 500


@dataclass(frozen=True)
class RunSignals:
    """The delay signals of one run at time `now` (see the module docstring)."""

    waiting_on: str
    waiting_on_actors: tuple[str, ...]
    waiting_since: datetime | None
    last_activity_at: datetime | None
    stalled: bool
    rate: float
    eta: datetime | None
    expired_leases: int
    remaining_required: int
    can_succeed: bool = True
    next_step: str = ""

    def status_fields(self) -> dict[str, Any]:
        """The signals a RunStatus carries, by field name (a board row adds
        `remaining_required`)."""
        return {
            "waiting_on": self.waiting_on,
            "waiting_on_actors": list(self.waiting_on_actors),
            "waiting_since": self.waiting_since,
            "last_activity_at": self.last_activity_at,
            "stalled": self.stalled,
            "rate": self.rate,
            "eta": self.eta,
            "expired_leases": self.expired_leases,
        }


def stall_seconds(policy: dict[str, Any]) -> float:
    """The run's stall threshold: `policy.stall_seconds`, else 900 s."""
    value = policy.get("stall_seconds")
    return DEFAULT_STALL_SECONDS if value is None else float(value)


def lease_seconds(policy: dict[str, Any] | None) -> float:
    """The run's lease length: `policy.lease_seconds`, else the manifest's 60 s."""
    value = (policy or {}).get("lease_seconds")
    return DEFAULT_LEASE_SECONDS if value is None else float(value)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def signals_for(tx: Tx, rows: Sequence[dict[str, Any]], now: datetime) -> dict[str, RunSignals]:
    """The signals of each run row (`lg_runs` columns run_id, state, counts, policy, review,
    created_at, updated_at, stopped_at; `counts` as `projections.counts.attach` gives them),
    by run id, read in transaction `tx`."""
    if len(rows) > _BATCH:  # bounded IN lists on every store
        out: dict[str, RunSignals] = {}
        for k in range(0, len(rows), _BATCH):
            out.update(signals_for(tx, rows[k : k + _BATCH], now))
        return out
    if not rows:
        return {}
    ids = [r["run_id"] for r in rows]
    open_ids = [r["run_id"] for r in rows if r["state"] not in S.TERMINAL_RUN_STATES]
    now_text = iso(now)
    window_start = iso(now - timedelta(seconds=RATE_WINDOW_SECONDS))
    # one statement for every signal but the lease holders (queries.sql, run_signals)
    found = tx.fetchall(
        SQL.sql(tx, "run_signals"),
        (
            S.IN_PROGRESS,
            now_text,
            S.IN_PROGRESS,
            now_text,
            S.IN_PROGRESS,
            window_start,
            window_start,
            now_text,
            tx_list(tx, ids),
        ),
    )
    open_set = set(open_ids)
    by_id = {r["run_id"]: r for r in rows}
    last: dict[str, Any] = {}
    expired: dict[str, tuple[int, str | None]] = {}
    finished: dict[str, int] = {}
    remaining: dict[str, int] = {}
    stepped: dict[str, str] = {}  # run id: the latest a lease may expire, by the clock
    lost: dict[str, int] = {}
    for r in found:
        run_id = r["run_id"]
        last[run_id] = r["last_at"]
        if run_id not in open_set:
            continue  # the rest are signals of open runs only
        if int(r["expired_n"] or 0):
            expired[run_id] = (int(r["expired_n"]), r["expired_oldest"])
        ahead = iso(now + timedelta(seconds=lease_seconds(_json(by_id[run_id].get("policy")))))
        if r["lease_latest"] is not None and ahead is not None and r["lease_latest"] > ahead:
            stepped[run_id] = ahead
        if int(r["finished"] or 0):
            finished[run_id] = int(r["finished"])
        # the required items still open: the run's open counts (its slot rows, read with
        # the row) less its optional open items, counted on the partial index that holds
        # optional items only, so the read does not walk every open item of a large run
        counts = _json(by_id[run_id]["counts"]) or {}
        left = sum(int(counts.get(s, 0)) for s in _REMAINING) - int(r["optional_open"] or 0)
        if left > 0:
            remaining[run_id] = left
        if int(r["lost_required"] or 0):
            lost[run_id] = int(r["lost_required"])
    holders: dict[str, list[str]] = {}
    if open_ids:
        for r in tx.fetchall(
            SQL.sql(tx, "lease_holders"), (tx_list(tx, open_ids), S.IN_PROGRESS, now_text)
        ):
            holders.setdefault(r["run_id"], []).append(r["lease_worker"])
    for run_id, ahead in stepped.items():
        # rare (after a backward step of the clock only): a lease expiring further ahead
        # than one lease is as good as expired, as the reconciler sees it (the same bound)
        n = tx.fetchone(SQL.sql(tx, "stepped_leases"), (run_id, S.IN_PROGRESS, ahead))
        n_expired, oldest = expired.get(run_id, (0, now_text))
        expired[run_id] = (n_expired + int(n["n"] if n else 0), oldest)
        holders[run_id] = [
            h["lease_worker"]
            for h in tx.fetchall(
                SQL.sql(tx, "lease_holders_of_run"), (run_id, S.IN_PROGRESS, now_text, ahead)
            )
        ]
    result: dict[str, RunSignals] = {}
    for row in rows:
        run_id = row["run_id"]
        result[run_id] = _one(
            row,
            now,
            parse_dt(last.get(run_id)),
            expired.get(run_id),
            holders.get(run_id, []),
            finished.get(run_id, 0),
            remaining.get(run_id, 0),
            _succeeds(tx, row, lost.get(run_id, 0)),
        )
    return result


def _one(
    row: dict[str, Any],
    now: datetime,
    last_activity: datetime | None,
    expired: tuple[int, str | None] | None,
    holders: list[str],
    finished: int,
    remaining: int,
    succeeds: bool,
) -> RunSignals:
    state = row["state"]
    counts = _json(row["counts"])
    policy = _json(row.get("policy")) or {}
    review = _json(row.get("review"))
    updated = parse_dt(row["updated_at"])
    owner = base_waiting_on(state, counts)
    n_expired = expired[0] if expired else 0
    actors: tuple[str, ...] = ()
    since: datetime | None
    if owner == "workers" and n_expired:
        # the lease looks live to a reader of counts, but its worker is gone: until the
        # reconciler expires it, nobody else can move that item
        owner = "reconciler"
        assert expired is not None
        since = parse_dt(expired[1])
    elif owner == "nobody":
        since = parse_dt(row.get("stopped_at")) or updated
    elif state == S.QUEUED:
        since = parse_dt(row["created_at"])
    elif state == S.AWAITING_REVIEW:
        since = parse_dt((review or {}).get("requested_at")) or updated
        reviewer = (review or {}).get("reviewer")
        actors = (reviewer,) if reviewer else ()
    elif state == S.RUNNING and owner in ("controller", "reviewer"):
        # the last item transition left only final (or quarantined) items: it handed the
        # run to this owner, and nothing has happened since
        since = max(d for d in (last_activity, updated) if d is not None)
    else:
        since = updated
    if owner == "workers":
        actors = tuple(holders[:_MAX_ACTORS])
    open_run = state not in S.TERMINAL_RUN_STATES
    rate = finished * 60.0 / RATE_WINDOW_SECONDS if open_run else 0.0
    eta = None
    # an ETA only where the workers' pace leads to an end the run can reach: running, and
    # not already lost (paused and draining runs move no item; see attention.can_succeed)
    if state == S.RUNNING and succeeds and rate > 0 and remaining:
        eta = now + timedelta(minutes=remaining / rate)
    stalled = (
        owner == "workers"
        and last_activity is not None
        and (now - last_activity).total_seconds() > stall_seconds(policy)
    )
    return RunSignals(
        waiting_on=owner,
        waiting_on_actors=actors,
        waiting_since=since,
        last_activity_at=last_activity,
        stalled=stalled,
        rate=round(rate, 3),
        eta=eta,
        expired_leases=n_expired,
        remaining_required=remaining if open_run else 0,
        can_succeed=succeeds,
        next_step=S.next_step(state, owner, succeeds),
    )


def _succeeds(tx: Tx, row: dict[str, Any], lost: int) -> bool:
    """attention.can_succeed of a run row, the required items counted only if needed."""
    run_id = row["run_id"]

    def required_total() -> int:
        found = tx.fetchone(SQL.sql(tx, "required_items_counted"), (run_id,))
        return int(found["n"]) if found else 0

    return can_succeed(
        row["state"],
        bool(row.get("cancel_requested")),
        _json(row.get("policy")) or {},
        lost,
        required_total,
    )
