"""Write the saved event histories in tests/histories/*.json.

Each scenario runs on a memory ledger with a manual clock; the file keeps the
stored events exactly as today's code writes them (topic, state as JSON,
originator id and version, position) and what the ledger showed at the end
(status, items, attempts, history of every run). tests/transfer/test_histories.py loads
the events into a fresh store of every kind, rebuilds the projections and checks
they still show the same. The files are a contract with the past:

* Add a file when you add a scenario or an event type: ``python scripts/make_histories.py
  NAME`` writes only the scenarios named (all when none is named) and never
  needs to rewrite an existing file.
* Never regenerate a file to make the replay test pass. A failure means stored
  events would no longer load or would project differently: evolve the event
  instead (see tests/transfer/test_histories.py: ``class_version`` plus a static
  ``upcast_v1_v2(state)`` on the event class, so old stored events are upgraded
  as they are read).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger import Actor, Ledger
from ledger.service.ledger import Outcome
from tests.histories.load import stored_events, to_json
from tests.support.clock import ManualClock

OUT = Path(__file__).resolve().parents[1] / "tests" / "histories"
SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
WORKER = Actor("w1", "worker")
WORKER2 = Actor("w2", "worker")
REVIEWER = Actor("rita", "reviewer")
OPERATOR = Actor("olga", "operator")
RECONCILER = Actor("rec", "reconciler")


def manifest(n: int, **policy: Any) -> dict[str, Any]:
    return {
        "source_version": "exports/2026-11-28",
        "config_version": "cfg-1",
        "scope": "history",
        "items": [
            {"item_id": f"i{k}", "payload": {"n": k}, "required": k != n - 1 or n == 1}
            for k in range(n)
        ],
        "policy": policy,
    }


def flaky_success(lg: Ledger, clock: ManualClock) -> None:
    """Retries after failed attempts, heartbeats, a batch of outcomes, success."""
    run = lg.submit(manifest(4, max_attempts=3, backoff_seconds=5), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    clock.advance(1)
    leases = lg.claim(run, WORKER, limit=4)
    lg.heartbeat(leases[0])
    clock.advance(2)
    lg.fail_attempt(leases[1], "connection reset by postgresql://app:hunter2@db/x", stage="fetch")
    lg.record(
        [
            Outcome(leases[0], "accept", evidence={"rows": 12}, stage="done"),
            Outcome(leases[2], "accept"),
            Outcome(leases[3], "accept"),
        ]
    )
    clock.advance(10)
    [again] = lg.claim(run, WORKER2)
    lg.accept(again, evidence={"rows": 3})
    lg.complete(run, CONTROLLER)


def cancel_in_flight(lg: Ledger, clock: ManualClock) -> None:
    """Cancel while leases are live: canceling, outcomes kept, the rest skipped, canceled."""
    run = lg.submit(manifest(5), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    leases = lg.claim(run, WORKER, limit=2)
    clock.advance(3)
    lg.cancel(run, OPERATOR, "wrong export")
    clock.advance(3)
    lg.accept(leases[0])
    lg.fail_attempt(leases[1], "interrupted")


def review_and_amend(lg: Ledger, clock: ManualClock) -> None:
    """A review bound to an input version, an amendment while awaiting it, approval, success."""
    run = lg.submit(
        manifest(3, review={"decision": "publish", "survives_amendment": False}), SUBMITTER
    ).run_id
    lg.start(run, CONTROLLER)
    lg.accept(lg.claim(run, WORKER)[0])
    lg.request_review(run, CONTROLLER, "publish")
    old = lg.status(run).input_version
    clock.advance(60)
    lg.amend(
        run,
        SUBMITTER,
        "late correction",
        items=[{"item_id": "i1", "payload": {"n": 100}}, {"item_id": "i3", "payload": {"n": 3}}],
        withdraw=["i2"],
    )
    assert lg.status(run).input_version != old
    lg.decide(run, REVIEWER, lg.status(run).input_version, True, "checked the correction")
    for lease in lg.claim(run, WORKER, limit=3):
        clock.advance(1)
        lg.accept(lease)
    lg.complete(run, CONTROLLER)


def partial_delivery_and_repairs(lg: Ledger, clock: ManualClock) -> None:
    """Quarantine, reject, skip, completed_with_errors, then repair and compensate runs;
    a transient failure and its retry; pause and resume."""
    run = lg.submit(
        manifest(5, partial_delivery=True, tolerated_failures=2, max_attempts=1), SUBMITTER
    ).run_id
    lg.start(run, CONTROLLER)
    lg.pause(run, OPERATOR, "maintenance window")
    lg.resume(run, OPERATOR, reason="back to work")
    a, b, c, d, e = lg.claim(run, WORKER, limit=5)
    lg.accept(a)
    lg.accept(b)
    lg.reject(c, "schema-mismatch", detail="column total missing")
    lg.fail_attempt(d, "parse error")
    lg.accept(e)
    lg.reject_item(run, d.item_id, REVIEWER, "unreadable")
    lg.complete(run, CONTROLLER)
    lg.repair(run, OPERATOR, reason="fix the rejected rows")
    lg.compensate(run, OPERATOR, "undo the export", items=[a.item_id])
    other = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(other, CONTROLLER)
    lg.claim(other, WORKER)
    clock.advance(5)
    lg.fail(
        other, CONTROLLER, "source unavailable", transient=True, failure_reason="input_unavailable"
    )
    lg.retry(other, SUBMITTER)


def reconciler(lg: Ledger, clock: ManualClock) -> None:
    """Expired leases become retryable or quarantined; a run past its deadline fails."""
    run = lg.submit(
        manifest(3, lease_seconds=30, max_attempts=2, run_deadline_seconds=600), SUBMITTER
    ).run_id
    lg.start(run, CONTROLLER)
    lg.claim(run, WORKER, limit=3)
    clock.advance(31)
    lg.reconcile(actor=RECONCILER)
    leases = lg.claim(run, WORKER2, limit=3)
    lg.accept(leases[0])
    clock.advance(31)
    lg.reconcile(actor=RECONCILER)
    clock.advance(600)
    lg.reconcile(actor=RECONCILER)


SCENARIOS: dict[str, Callable[[Ledger, ManualClock], None]] = {
    "flaky_success": flaky_success,
    "cancel_in_flight": cancel_in_flight,
    "review_and_amend": review_and_amend,
    "partial_delivery_and_repairs": partial_delivery_and_repairs,
    "reconciler": reconciler,
}


def snapshot(lg: Ledger) -> dict[str, Any]:
    """What the ledger shows for every run: status, items, attempts, history."""
    out: dict[str, Any] = {}
    for st in sorted(lg.runs(limit=10_000), key=lambda s: s.run_id):
        out[st.run_id] = {
            "status": st.to_dict(),
            "items": [i.to_dict() for i in lg.items(st.run_id)],
            "attempts": [a.to_dict() for a in lg.attempts(st.run_id)],
            "history": [t.to_dict() for t in lg.history(st.run_id)],
        }
    return out


def make(name: str) -> dict[str, Any]:
    clock = ManualClock(datetime(2026, 11, 28, 9, 0, tzinfo=UTC))
    with Ledger.open("memory://", clock=clock) as lg:
        SCENARIOS[name](lg, clock)
        events = [{"position": pos, **to_json(se)} for pos, se in stored_events(lg)]
        return {
            "scenario": name,
            "doc": (SCENARIOS[name].__doc__ or "").strip(),
            "made_by": "scripts/make_histories.py",
            "events": events,
            "runs": snapshot(lg),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "names", nargs="*", help=f"scenarios (default: all): {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite existing files (do not, see above)"
    )
    args = parser.parse_args(argv)
    for name in args.names or list(SCENARIOS):
        path = OUT / f"{name}.json"
        if path.exists() and not args.force:
            print(f"{path} exists; kept (histories are a contract with the past)")
            continue
        data = make(name)
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path}: {len(data['events'])} events, {len(data['runs'])} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
