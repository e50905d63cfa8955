"""Worker without `prefetch=` adapts it: it starts at `concurrency`, grows while the
handlers are fast (so `Worker(lg, run_id, handle)` claims in large batches), and stays
near `concurrency` when they are slow (leases are not hoarded behind slow handlers)."""

from __future__ import annotations

import time
from typing import Any

from ledger import Accepted, Lease, Ledger, Worker
from ledger.worker.worker import MAX_ADAPTIVE_PREFETCH
from tests.support.runs import items_from_one, running


def _claim_limits(lg: Ledger) -> list[int]:
    """Wrap this ledger's claim to record each limit the Worker asks for."""
    limits: list[int] = []
    claim = lg.claim

    def spy(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        return claim(*args, **kwargs)

    lg.claim = spy  # type: ignore[method-assign]
    return limits


def test_fast_handlers_grow_the_claims_up_to_the_cap(lg: Ledger) -> None:
    run_id = running(lg, 700, manifest_of=items_from_one)
    limits = _claim_limits(lg)
    summary = Worker(lg, run_id, lambda lease: Accepted(), concurrency=2).run()
    assert summary.accepted == 700
    assert limits[0] == 2  # it starts small
    assert max(limits) > 100  # and grows: a few large transactions, not 350 small ones
    assert max(limits) <= MAX_ADAPTIVE_PREFETCH
    assert len(limits) < 700 / 10


def test_slow_handlers_keep_the_claims_small(lg: Ledger) -> None:
    # lease_seconds=1: queued leases should drain within 0.1 s; each handler takes
    # at least 0.05 s, so at most 2 + 2 * 0.1 / 0.05 = 6 leases are held at once
    run_id = running(lg, 16, lease_seconds=1, manifest_of=items_from_one)
    limits = _claim_limits(lg)

    def slow(lease: Lease) -> Accepted:
        time.sleep(0.05)
        return Accepted()

    summary = Worker(lg, run_id, slow, concurrency=2).run()
    assert summary.accepted == 16
    assert max(limits) <= 6


def test_an_explicit_prefetch_is_kept(lg: Ledger) -> None:
    run_id = running(lg, 60, manifest_of=items_from_one)
    limits = _claim_limits(lg)
    worker = Worker(lg, run_id, lambda lease: Accepted(), concurrency=2, prefetch=4)
    assert worker.run().accepted == 60
    assert max(limits) <= 4 and worker.prefetch == 4
