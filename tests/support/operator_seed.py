"""A ledger as an operator finds it: healthy, idle, dead-worker and
review-waiting runs among many newer finished ones, and optionally one big run.

Written with a clock that runs from two hours ago up to a few seconds ago, so a
server on the real clock sees the leases of the dead worker expired, the idle run
stalled and the healthy run active. Used by the browser test, the CLI tests and
`python -m tests.support.operator_seed DSN` (the README's screenshots).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger import Actor, Ledger
from tests.support.clock import ManualClock
from tests.support.runs import manifest

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
REVIEWER = Actor("rita", "reviewer")
OPERATOR = Actor("olga", "operator")


def _m(n: int, scope: str, **policy: Any) -> dict[str, Any]:
    m = manifest(n, **policy)
    m["scope"] = scope
    return m


def seed(dsn: str, finished: int = 595, big_items: int = 0) -> dict[str, str]:
    """Write the runs (in time order: the store's clock never runs backwards); returns their ids by name (review, dead, idle, healthy, paused, big,
    failed)."""
    now = datetime.now(UTC)
    clock = ManualClock(now - timedelta(hours=2))
    runs: dict[str, str] = {}
    with Ledger.open(dsn, clock=clock) as lg:
        # the oldest open run: awaiting review, with 500+ newer runs after it
        runs["review"] = lg.submit(
            _m(3, "payroll export, week 48", review={"decision": "finance-sign-off"}), SUBMITTER
        ).run_id
        lg.start(runs["review"], CONTROLLER)
        for lease in lg.claim(runs["review"], Actor("w-payroll", "worker"), limit=3):
            lg.accept(lease)
        lg.request_review(runs["review"], CONTROLLER, "finance-sign-off", reviewer=REVIEWER.id)
        clock.advance(60)
        for k in range(finished):
            run_id = lg.submit(_m(1, f"nightly price sync #{k}"), SUBMITTER).run_id
            if k % 7 == 3:
                lg.fail(
                    run_id,
                    CONTROLLER,
                    "supplier file missing",
                    transient=True,
                    failure_reason="input_unavailable",
                )
            else:
                lg.fail(run_id, OPERATOR, "superseded by a newer sync", transient=True)
        runs["failed"] = run_id
        # healthy: started an hour ago, items finished in the last minutes
        clock.set(now - timedelta(minutes=59))
        runs["healthy"] = lg.submit(_m(40, "catalogue images, batch 12"), SUBMITTER).run_id
        lg.start(runs["healthy"], CONTROLLER)
        clock.set(now - timedelta(minutes=50))
        runs["paused"] = lg.submit(_m(4, "warehouse stock sync"), SUBMITTER).run_id
        lg.start(runs["paused"], CONTROLLER)
        lg.pause(runs["paused"], OPERATOR, "supplier API maintenance window")
        # a run whose worker died: three leases expired 30 minutes ago, nobody reconciled
        runs["dead"] = lg.submit(_m(6, "bank statement import", lease_seconds=60), SUBMITTER).run_id
        lg.start(runs["dead"], CONTROLLER)
        dead_worker = Actor("w-7f3a", "worker")
        for lease in lg.claim(runs["dead"], dead_worker, limit=3):
            lg.accept(lease)
        lg.claim(runs["dead"], dead_worker, limit=3)
        # idle: its worker holds a long lease and has done nothing for 40 minutes
        clock.set(now - timedelta(minutes=40))
        runs["idle"] = lg.submit(
            _m(5, "customer invoices, November", lease_seconds=7200), SUBMITTER
        ).run_id
        lg.start(runs["idle"], CONTROLLER)
        (lease,) = lg.claim(runs["idle"], Actor("w-slow", "worker"))
        if big_items:
            clock.set(now - timedelta(minutes=30))
            runs["big"] = lg.submit(
                _m(big_items, "search index rebuild, 5k shards", lease_seconds=600), SUBMITTER
            ).run_id
            lg.start(runs["big"], CONTROLLER)
            clock.set(now - timedelta(minutes=4, seconds=30))
            done = 0
            while done < big_items // 2:
                leases = lg.claim(runs["big"], Actor("w-index", "worker"), limit=250)
                lg.record([_accepted(lease) for lease in leases])
                done += len(leases)
                clock.advance(9)
            lg.claim(runs["big"], Actor("w-index", "worker"), limit=20)
        clock.set(now - timedelta(minutes=2))
        for _ in range(10):
            clock.advance(10)
            for lease in lg.claim(runs["healthy"], Actor("w-ok", "worker"), limit=2):
                lg.accept(lease)
        clock.set(now - timedelta(seconds=5))
    return runs


def _accepted(lease: Any) -> Any:
    from ledger.service.ledger import Outcome

    return Outcome(lease, "accept")


if __name__ == "__main__":
    print(seed(sys.argv[1], big_items=int(sys.argv[2]) if len(sys.argv) > 2 else 5000))
