"""Prometheus metrics of a ledger (the `prometheus_client` library; every name `ledger_`).

`LedgerCollector(lg, snapshot)` reads the ledger's accepted state at each scrape: the
overview (open runs by state and owner, oldest waits, stalled runs, expired leases, items
of open runs by state), from the server's overview snapshot (at most a few seconds old;
`ledger_overview_age_seconds` says how old), and the transition totals. The totals are counters the store already
holds: the collector counts the transitions appended since its previous scrape (a range
read of the transition log by position), so a scrape never scans the whole log after
the first one, and every server process reports the same ledger-wide totals.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ledger.http.sql import SQL

if TYPE_CHECKING:
    from ledger.reads.overview import OverviewSnapshot
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Store

# Names, for the README and the tests.
OPEN_RUNS = "ledger_open_runs"
OPEN_RUNS_WAITING = "ledger_open_runs_waiting"
OLDEST_WAIT = "ledger_oldest_wait_seconds"
ITEMS = "ledger_items"
STALLED = "ledger_stalled_runs"
EXPIRED = "ledger_expired_leases"
TRANSITIONS = "ledger_transitions"  # exposed as ledger_transitions_total
EXPIRATIONS = "ledger_lease_expirations"  # exposed as ledger_lease_expirations_total
OVERVIEW_AGE = "ledger_overview_age_seconds"
FOLLOWER_LAG = "ledger_follower_lag_events"
FOLLOWER_LAG_SECONDS = "ledger_follower_lag_seconds"
# The reconciler's item command: the lease expired and the attempt ended `lease_expired`.
EXPIRE_COMMAND = "expire"
_TALLY_PAGE = 50_000


class TransitionTally:
    """Transitions per command, counted once each by position (thread-safe)."""

    def __init__(self) -> None:
        self.after = 0
        self.by_command: dict[str, int] = {}
        self._lock = threading.Lock()

    def update(self, store: Store) -> dict[str, int]:
        """Count the transitions stored since the previous call; return the totals."""
        with self._lock:
            while True:
                with store.read() as tx:
                    # never past a position a slower writer may still fill in (rule 18):
                    # a transition counted late is counted, one skipped never would be
                    bound = tx.readable_position()
                    top = tx.fetchone(
                        SQL.sql(tx, "tally_end" if bound is None else "tally_end_upto"),
                        (self.after, *(() if bound is None else (bound,)), _TALLY_PAGE),
                    )
                    upto = top["p"] if top else None
                    if upto is None:
                        break
                    for r in tx.fetchall(SQL.sql(tx, "tally_by_command"), (self.after, upto)):
                        self.by_command[r["command"]] = self.by_command.get(r["command"], 0) + int(
                            r["n"]
                        )
                self.after = int(upto)
            return dict(self.by_command)


class LedgerCollector(Collector):
    """The ledger's state as metric families, read at each scrape."""

    def __init__(self, lg: Ledger, snapshot: OverviewSnapshot | None = None) -> None:
        self.lg = lg
        self.snapshot = snapshot
        self.tally = TransitionTally()

    def describe(self) -> list[Metric]:
        # no families up front: registering must not read the store
        return []

    def collect(self) -> Iterator[Metric]:
        ov = self.lg.overview() if self.snapshot is None else self.snapshot.get()
        yield GaugeMetricFamily(
            OVERVIEW_AGE,
            "Age of the overview the ledger_ gauges below come from (0: read for this scrape).",
            value=ov.age_seconds,
        )
        runs = GaugeMetricFamily(OPEN_RUNS, "Open (not terminal) runs by state.", labels=["state"])
        for state, n in ov.by_state.items():
            runs.add_metric([state], n)
        yield runs
        waiting = GaugeMetricFamily(
            OPEN_RUNS_WAITING,
            "Open runs by who owns the delay (waiting_on).",
            labels=["waiting_on"],
        )
        for who, n in ov.by_waiting_on.items():
            waiting.add_metric([who], n)
        yield waiting
        oldest = GaugeMetricFamily(
            OLDEST_WAIT,
            "Seconds the longest-waiting open run has waited on each owner.",
            labels=["waiting_on"],
        )
        for who in ov.by_waiting_on:
            wait = ov.oldest_wait.get(who)
            oldest.add_metric([who], wait.seconds if wait else 0.0)
        yield oldest
        items = GaugeMetricFamily(ITEMS, "Items of open runs by state.", labels=["state"])
        for state, n in ov.items_by_state.items():
            items.add_metric([state], n)
        yield items
        yield GaugeMetricFamily(
            STALLED,
            "Open runs waiting on workers with no activity for policy.stall_seconds.",
            value=ov.stalled,
        )
        yield GaugeMetricFamily(
            EXPIRED,
            "Leases past their expiry that the reconciler has not expired yet.",
            value=ov.expired_leases,
        )
        totals = self.tally.update(self.lg.store)
        transitions = CounterMetricFamily(
            TRANSITIONS, "Run and item transitions stored, by command.", labels=["command"]
        )
        for cmd in sorted(totals):
            transitions.add_metric([cmd], totals[cmd])
        yield transitions
        yield CounterMetricFamily(
            EXPIRATIONS,
            "Leases the reconciler expired (attempts ended lease_expired).",
            value=totals.get(EXPIRE_COMMAND, 0),
        )
        lags = follower_lags(self.lg)
        if lags:
            events = GaugeMetricFamily(
                FOLLOWER_LAG, "Transitions a follower has yet to handle.", labels=["follower"]
            )
            seconds = GaugeMetricFamily(
                FOLLOWER_LAG_SECONDS,
                "Age of the oldest transition a follower has yet to handle (0 when caught up).",
                labels=["follower"],
            )
            for name, behind, age in lags:
                events.add_metric([name], behind)
                seconds.add_metric([name], age)
            yield events
            yield seconds


def follower_lags(lg: Ledger) -> list[tuple[str, int, float]]:
    """(name, transitions behind, seconds behind) of each follower; empty without followers."""
    from ledger.feed.follower import followers

    return [(f.name, f.lag, f.lag_seconds) for f in followers(lg)]
