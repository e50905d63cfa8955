"""`overview(store)`: what is stuck, on whom, across every open run of the ledger.

Its cost follows the runs that need attention, not the open runs. The counts come from
what the writes keep: open runs by state from the run state index, items of open runs
from the count rows (`ledger.projections.counts`), expired leases from the item lease
index. The rule of `ledger.reads.signals` (who each run waits on, since when, stalled) runs
only for the runs whose owner is not simply "workers": those awaiting review, paused,
pausing or canceling, running with nothing left to claim, with an expired lease, and the
first MAX_LISTED of those past their stall threshold; plus the 20 longest waits of the
queued runs and of the running ones (two ordered reads). Every other running run waits
on workers.

Two parts still grow with the running runs, as index probes inside one statement each,
no row of them read into Python: whether each running run has an item left to claim
(`overview_drained`), and the latest transition of each running run whose own row is
older than the default stall threshold (`overview_stalled`: the store counts them and
returns only the first few). Runs whose policy sets its own threshold come from an index
holding only them (schema v15) and are checked here, one batch at a time.

`overview_recount(store)` applies the rule to every open run, one page at a time: the
definition the fast read is tested against. Both sum their runs through one builder
(`_Tally`).
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.rows import iso, parse_dt
from ledger.core.views import _View
from ledger.projections.counts import attach as attach_counts
from ledger.reads.signals import (
    DEFAULT_STALL_SECONDS,
    OWNERS,
    RunSignals,
    signals_for,
    stall_seconds,
)
from ledger.reads.sql import SQL
from ledger.stores.named import tx_list

if TYPE_CHECKING:
    from ledger.stores.base import Store

PAGE = 500
MAX_LISTED = 20
OPEN_STATES: tuple[str, ...] = tuple(s for s in S.RUN_STATES if s not in S.TERMINAL_RUN_STATES)


@dataclass(frozen=True)
class OldestWait(_View):
    """The open run that has waited longest on one owner."""

    run_id: str
    since: datetime
    seconds: float


@dataclass(frozen=True)
class StuckRun(_View):
    """An open run that needs someone's attention: stalled, or with expired leases."""

    run_id: str
    state: str
    waiting_on: str
    waiting_since: datetime | None
    last_activity_at: datetime | None
    expired_leases: int
    stalled: bool
    scope: str
    seq: int = 0
    next_step: str = ""


@dataclass(frozen=True)
class Overview(_View):
    """Open runs by state and by owner, the oldest wait per owner, stalled runs and expired
    leases, over every run in the store at time `at` (the store's clock)."""

    at: datetime
    open_runs: int
    by_state: dict[str, int]
    by_waiting_on: dict[str, int]
    oldest_wait: dict[str, OldestWait]
    stalled: int
    expired_leases: int
    runs_with_expired_leases: int
    items_by_state: dict[str, int]
    stuck: list[StuckRun] = field(default_factory=list)
    longest_waiting: list[StuckRun] = field(default_factory=list)
    # Seconds since `at` when the overview comes from a snapshot (OverviewSnapshot); 0: read now.
    age_seconds: float = 0.0


class OverviewSnapshot:
    """The overview of `store`, read again at most every `max_age` seconds.

    Every reader of a server (the operator pages, `/overview`, each Prometheus scrape)
    shares one: however many ask, the store pays for one overview per interval, and the
    answer says how old it is (`age_seconds`). Only the first read of all waits for the
    store: a reader that finds the snapshot stale gets it as it is (with its age) while a
    background thread reads the next one (`background=False`: that reader reads it
    itself). The interval stretches to `DUTY` times what the last read took, so however
    large the ledger, reading the overview keeps the store busy a bounded share of the
    time."""

    DUTY = 10.0

    def __init__(
        self,
        store: Store | None,
        max_age: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self.background = background
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._current: Overview | None = None
        self._taken = 0.0
        self._cost = 0.0  # seconds the last read took

    def _fresh_enough(self) -> bool:
        interval = max(self.max_age, self.DUTY * self._cost) if self.max_age > 0 else 0.0
        return self._current is not None and self._clock() - self._taken < interval

    def get(self) -> Overview:
        """The snapshot, read again (in the background, once there is one) when older than
        its interval."""
        with self._lock:
            current, taken = self._current, self._taken
            fresh_enough = self._fresh_enough()
        if current is not None and fresh_enough:
            return self._aged(current, taken)
        if current is not None and self.background and self.max_age > 0:
            if self._refreshing.acquire(blocking=False):
                threading.Thread(
                    target=self._refresh_released, name="overview-snapshot", daemon=True
                ).start()
            return self._aged(current, taken)
        with self._refreshing:
            with self._lock:  # a thread that waited may find it fresh already
                if self._fresh_enough():
                    assert self._current is not None
                    return self._aged(self._current, self._taken)
            return self._refresh()

    def _refresh(self) -> Overview:
        started = self._clock()
        assert self.store is not None, "a snapshot of no store is never read"
        fresh = overview(self.store)
        with self._lock:
            self._current, self._taken = fresh, started
            self._cost = max(0.0, self._clock() - started)
        return fresh

    def _refresh_released(self) -> None:
        try:
            self._refresh()
        except Exception:
            # readers keep the last snapshot (its age grows); the next stale read tries again
            logging.getLogger(__name__).warning("reading the overview failed", exc_info=True)
        finally:
            self._refreshing.release()

    def _aged(self, ov: Overview, taken: float) -> Overview:
        return replace(ov, age_seconds=round(max(0.0, self._clock() - taken), 3))


class _Tally:
    """The overview's sums over the runs read with the rule applied, in seq order: one
    builder for the counted overview and the recount. A run `counted` adds to the owners
    and the stalled total; every run read may be the oldest wait of its owner, among the
    longest waits, or stuck (stalled or with expired leases, the first MAX_LISTED)."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.by_owner = {o: 0 for o in OWNERS if o != "nobody"}
        self.oldest: dict[str, OldestWait] = {}
        self.stuck: list[StuckRun] = []
        self.waits: list[StuckRun] = []
        self.stalled = 0

    def add(self, row: dict[str, Any], sig: RunSignals, counted: bool = True) -> None:
        entry = _entry(row, sig)
        since = sig.waiting_since
        best = self.oldest.get(sig.waiting_on)
        if since is not None and (best is None or since < best.since):
            self.oldest[sig.waiting_on] = OldestWait(
                row["run_id"], since, max(0.0, (self.now - since).total_seconds())
            )
        if since is not None:
            self.waits.append(entry)
            if len(self.waits) > 2 * PAGE:  # bounded memory however many runs are read
                self.waits = heapq.nsmallest(MAX_LISTED, self.waits, key=_since)
        if (sig.stalled or sig.expired_leases) and len(self.stuck) < MAX_LISTED:
            self.stuck.append(entry)
        if counted:
            self.by_owner[sig.waiting_on] = self.by_owner.get(sig.waiting_on, 0) + 1
            self.stalled += sig.stalled

    def overview(
        self,
        by_state: dict[str, int],
        items: dict[str, int],
        expired_leases: int,
        runs_with_expired_leases: int,
    ) -> Overview:
        return Overview(
            at=self.now,
            open_runs=sum(by_state[s] for s in OPEN_STATES),
            by_state={s: by_state[s] for s in OPEN_STATES},
            by_waiting_on=self.by_owner,
            oldest_wait={o: self.oldest[o] for o in OWNERS if o in self.oldest},
            stalled=self.stalled,
            expired_leases=expired_leases,
            runs_with_expired_leases=runs_with_expired_leases,
            items_by_state=items,
            stuck=self.stuck,
            longest_waiting=heapq.nsmallest(MAX_LISTED, self.waits, key=_since),
        )


def _open_runs_by_state(tx: Any) -> dict[str, int]:
    by_state = {s: 0 for s in OPEN_STATES}
    for r in tx.fetchall(SQL.sql(tx, "open_runs_by_state")):
        by_state[r["state"]] = int(r["n"])
    return by_state


def overview_recount(store: Store) -> Overview:
    """The overview by the rule applied to every open run (cost: the open runs), read in
    one consistent read transaction of `store`: what `overview` must equal."""
    with store.read() as tx:
        now: datetime = tx.now()
        by_state = _open_runs_by_state(tx)
        lease = tx.fetchone(SQL.sql(tx, "expired_leases"), (iso(now),))
        items = {s: 0 for s in S.ITEM_STATES}
        tally = _Tally(now)
        after = -1
        while True:
            rows = tx.fetchall(SQL.sql(tx, "open_runs_page"), (after, PAGE))
            if not rows:
                break
            after = rows[-1]["seq"]
            attach_counts(tx, rows)
            signals = signals_for(tx, rows, now)
            for row in rows:
                for state, n in _counts(row["counts"]).items():
                    items[state] = items.get(state, 0) + int(n)
                tally.add(row, signals[row["run_id"]])
            if len(rows) < PAGE:
                break
    return tally.overview(
        by_state,
        items,
        int(lease["n"]) if lease else 0,
        int(lease["runs"]) if lease else 0,
    )


def _since(run: StuckRun) -> datetime:
    assert run.waiting_since is not None
    return run.waiting_since


def _counts(value: Any) -> dict[str, int]:
    out: dict[str, int] = json.loads(value) if isinstance(value, str) else value
    return out


def overview(store: Store) -> Overview:
    """The overview, read in one consistent read transaction of `store` (its cost follows
    the runs needing attention; see the module docstring)."""
    with store.read() as tx:
        now: datetime = tx.now()
        by_state = _open_runs_by_state(tx)
        lease = tx.fetchone(SQL.sql(tx, "expired_leases"), (iso(now),))
        items = {s: 0 for s in S.ITEM_STATES}
        for r in tx.fetchall(SQL.sql(tx, "overview_items")):
            if r["state"] in items:
                items[r["state"]] = int(r["n"] or 0)
        # runs with their rule applied, by id: the ones needing attention first
        rows: dict[str, dict[str, Any]] = {}
        for r in tx.fetchall(SQL.sql(tx, "overview_deciding")):
            rows[r["run_id"]] = r
        for r in tx.fetchall(SQL.sql(tx, "overview_drained")):
            rows[r["run_id"]] = r
        expired = [
            r["run_id"] for r in tx.fetchall(SQL.sql(tx, "overview_expired_runs"), (iso(now),))
        ]
        _add(tx, rows, [run_id for run_id in expired if run_id not in rows])
        # after a backward step of the clock (a transition stamped later than it reads), a
        # lease granted before the step may lie further ahead than its run's lease length:
        # the reconciler ends it, and the signals count it as expired (signals.py). Only then
        # are the runs holding live leases read, to find those.
        latest = tx.fetchone(SQL.sql(tx, "overview_latest_at"))
        stepped = bool(latest and latest["at"] is not None and str(latest["at"]) > str(iso(now)))
        if stepped:
            leased = tx.fetchall(SQL.sql(tx, "overview_leased_runs"), (iso(now),))
            _add(tx, rows, [r["run_id"] for r in leased if r["run_id"] not in rows])
        # running runs past their stall threshold, by their latest transition: counted, and
        # read whole only for the first of the stuck list (each waits on workers since its
        # row changed, so the longest waits below cover the rest)
        n_stalled, first_stalled = _past_stall(tx, now, rows)
        _add(tx, rows, first_stalled)
        attention = set(rows)
        # the longest waits among the rest: queued runs (since created) and running runs
        # waiting on workers (since their row changed)
        for r in tx.fetchall(SQL.sql(tx, "overview_oldest_queued"), (MAX_LISTED,)):
            rows.setdefault(r["run_id"], r)
        listed = 0
        for r in tx.fetchall(
            SQL.sql(tx, "overview_oldest_running"), (MAX_LISTED + len(attention),)
        ):
            if r["run_id"] not in attention and listed < MAX_LISTED:
                rows.setdefault(r["run_id"], r)
                listed += 1
        ordered = sorted(rows.values(), key=lambda r: int(r["seq"]))
        attach_counts(tx, ordered)
        signals = signals_for(tx, ordered, now)
    tally = _Tally(now)
    listed_stalled = set(first_stalled)
    for row in ordered:
        # counted: the runs needing attention; a run listed for its wait only, or one of
        # the stalled running runs, is counted below
        run_id = row["run_id"]
        tally.add(row, signals[run_id], run_id in attention and run_id not in listed_stalled)
    # every open run not read above: queued ones wait on their controller, running ones
    # (the stalled ones too) on their workers
    tally.stalled += n_stalled
    tally.by_owner[S.CONTROLLER] += by_state[S.QUEUED]
    open_runs = sum(by_state[s] for s in OPEN_STATES)
    tally.by_owner["workers"] += open_runs - sum(tally.by_owner.values())
    n_expired = int(lease["n"]) if lease else 0
    runs_expired = int(lease["runs"]) if lease else 0
    if stepped:
        # every run with an expired or a stepped lease was read above: count from the signals
        with_leases = [signals[r] for r in attention if signals[r].expired_leases]
        n_expired = sum(sig.expired_leases for sig in with_leases)
        runs_expired = len(with_leases)
    return tally.overview(by_state, items, n_expired, runs_expired)


def _entry(row: dict[str, Any], sig: Any) -> StuckRun:
    return StuckRun(
        row["run_id"],
        row["state"],
        sig.waiting_on,
        sig.waiting_since,
        sig.last_activity_at,
        sig.expired_leases,
        sig.stalled,
        row["scope"],
        int(row["seq"]),
        sig.next_step,
    )


def _add(tx: Any, rows: dict[str, dict[str, Any]], run_ids: list[str]) -> None:
    """Read the open runs among `run_ids` into `rows`."""
    for k in range(0, len(run_ids), PAGE):
        for r in tx.fetchall(SQL.sql(tx, "overview_runs"), (tx_list(tx, run_ids[k : k + PAGE]),)):
            if r["state"] in OPEN_STATES:
                rows.setdefault(r["run_id"], r)


def _past_stall(tx: Any, now: datetime, known: dict[str, dict[str, Any]]) -> tuple[int, list[str]]:
    """Running runs not in `known` whose latest transition is older than their stall
    threshold (a run with a live lease too: its worker may have gone quiet): how many, and
    the first MAX_LISTED by seq. Those with the default threshold are counted by one
    statement; those whose policy sets its own are read here."""
    found = tx.fetchall(
        SQL.sql(tx, "overview_stalled"),
        (
            iso(now - timedelta(seconds=DEFAULT_STALL_SECONDS)),
            tx_list(tx, list(known)),
            iso(now - timedelta(seconds=DEFAULT_STALL_SECONDS)),
            MAX_LISTED,
        ),
    )
    n = int(found[0]["n"]) if found else 0
    first = {r["run_id"]: int(r["seq"]) for r in found}
    candidates = [
        r for r in tx.fetchall(SQL.sql(tx, "overview_own_stall")) if r["run_id"] not in known
    ]
    for k in range(0, len(candidates), PAGE):
        batch = candidates[k : k + PAGE]
        limits = {r["run_id"]: stall_seconds(_json(r["policy"]) or {}) for r in batch}
        seqs = {r["run_id"]: int(r["seq"]) for r in batch}
        for r in tx.fetchall(
            SQL.sql(tx, "runs_last_activity"), (tx_list(tx, [r["run_id"] for r in batch]),)
        ):
            last = parse_dt(r["last_at"])
            if last is not None and (now - last).total_seconds() > limits[r["run_id"]]:
                first[r["run_id"]] = seqs[r["run_id"]]
                n += 1
    return n, sorted(first, key=first.__getitem__)[:MAX_LISTED]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
