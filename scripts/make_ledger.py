"""Fill a ledger with about N events through the public API (for rebuild and verify at scale).

    python scripts/make_ledger.py --dsn sqlite:////tmp/big.db --events 1000000
    python scripts/make_ledger.py --dsn postgresql://postgres@127.0.0.1:5432/big --events 1000000

Every event is written by an ordinary command (submit, start, claim, record,
heartbeat, cancel, complete), so the live projections are the ones the commands
wrote, not a rebuild's. Runs of --items-per-run items are submitted and started;
workers w1..w4 claim --batch items at a time (up to the ledger's maximum of
1,000) and record one outcome per lease in one `record` call: mostly accepts,
some rejects, some retryable failures (claimed again later; the third failure
quarantines the item); one lease per batch is extended by a heartbeat. Each run
then completes (partial delivery: succeeded or completed_with_errors), except
every fifth run, which an operator cancels half way (the rest of its items are
skipped). The mix is seeded (--seed), so two runs of the script make histories
of the same shape. Stops once the store holds at least --events events; an
existing ledger is topped up.

Each item costs about 3.3 events (registered, claimed, one outcome; a retry adds
two), each run 2-3 plus its cancel skips.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ledger import Actor, Ledger
from ledger.service.ledger import MAX_CLAIM, Outcome

SUBMITTER = Actor("ingest", "submitter")
CONTROLLER = Actor("scheduler", "controller")
OPERATOR = Actor("ops-oncall", "operator")
WORKERS = [Actor(f"w{k}", "worker") for k in range(1, 5)]


def event_count(lg: Ledger) -> int:
    """Events in the ledger's store."""
    with lg.store.read() as tx:
        row = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
    return int(row["n"]) if row else 0


def one_run(lg: Ledger, k: int, items: int, batch: int, rng: random.Random) -> str:
    """Submit, start and process one run; returns its final state."""
    manifest = {
        "source_version": f"export/{k // 10}",
        "config_version": "cfg-7",
        "scope": f"batch {k}",
        "items": [
            {
                "item_id": f"doc-{i:06d}",
                "required": i % 50 != 49,
                "payload": {"n": i, "uri": f"s3://inbox/{k}/{i}.pdf"},
            }
            for i in range(items)
        ],
        "policy": {"partial_delivery": True, "max_attempts": 3, "lease_seconds": 600},
    }
    run_id = lg.submit(manifest, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    cancel_at = items // 2 if k % 5 == 4 else None
    done = 0
    while leases := lg.claim(run_id, rng.choice(WORKERS), limit=batch):
        lg.heartbeat(leases[0])  # a worker that needs longer extends its lease
        outcomes = []
        for lease in leases:
            roll = rng.random()
            if roll < 0.08:
                outcomes.append(Outcome(lease, "fail", error="timeout talking to OCR", stage="ocr"))
            elif roll < 0.10:
                outcomes.append(
                    Outcome(lease, "reject", rule="unreadable", detail="blank page", stage="ocr")
                )
            else:
                outcomes.append(
                    Outcome(lease, "accept", evidence={"pages": 1 + lease.attempt}, stage="index")
                )
        refused = [r for r in lg.record(outcomes) if isinstance(r, Exception)]
        if refused:
            raise RuntimeError(f"record refused {len(refused)} outcomes, first: {refused[0]!r}")
        done += len(leases)
        if cancel_at is not None and done >= cancel_at:
            return lg.cancel(run_id, OPERATOR, "source withdrawn").state
    return lg.complete(run_id, CONTROLLER).state


def fill(
    dsn: str, target: int, items_per_run: int, batch: int, seed: int, quiet: bool = False
) -> int:
    """Add runs until the ledger at `dsn` holds at least `target` events; the final count."""
    if not 1 <= batch <= MAX_CLAIM:
        raise SystemExit(f"--batch must be from 1 to {MAX_CLAIM}")
    rng = random.Random(seed)
    with Ledger.open(dsn) as lg:
        have = start = event_count(lg)
        t0 = time.monotonic()
        k = len(lg.runs(limit=10_000))  # new runs get new names when topping up
        while have < target:
            # ~3.3 events per item: the last run is cut to land near the target
            items = max(1, min(items_per_run, int((target - have) / 3.3) + 1))
            state = one_run(lg, k, items, batch, rng)
            have = event_count(lg)
            k += 1
            if not quiet:
                rate = (have - start) / max(1e-9, time.monotonic() - t0)
                print(
                    f"run {k}: {items} items, {state}; {have:,} events ({rate:,.0f} events/s)",
                    flush=True,
                )
    return have


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("LEDGER_DSN", "sqlite:///./ledger.db"),
        help="the ledger to fill [default: $LEDGER_DSN, else sqlite:///./ledger.db]",
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="stop at this many events or more"
    )
    parser.add_argument("--items-per-run", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=MAX_CLAIM, help="items per claim")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    n = fill(args.dsn, args.events, args.items_per_run, args.batch, args.seed, args.quiet)
    print(f"{n:,} events in {args.dsn} ({time.monotonic() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
