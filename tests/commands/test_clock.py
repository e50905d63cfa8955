"""The injected clock: it stamps events and judges leases; times never move backwards
within a stream, even when the clock does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ledger import InvalidInput, LeaseLost, Ledger
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.drive import event_count, submit
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest


def test_event_times_come_from_the_injected_clock(lg: Ledger, clock: ManualClock) -> None:
    t0 = datetime(2031, 2, 3, 4, 5, 6, 789_000, tzinfo=UTC)
    clock.set(t0)
    rid = submit(lg, 2)
    clock.advance(10)
    lg.start(rid, CONTROLLER)
    clock.advance(2.5)
    le = lg.claim(rid, WORKER, limit=1)[0]
    clock.advance(7)
    lg.accept(le)
    hist = lg.history(rid)
    assert [(t.command, t.at) for t in hist] == [
        ("submit", t0),
        ("start", t0 + timedelta(seconds=10)),
        ("claim", t0 + timedelta(seconds=12.5)),
        ("accept", t0 + timedelta(seconds=19.5)),
    ]
    st = lg.status(rid)
    assert st.created_at == t0
    assert st.started_at == t0 + timedelta(seconds=10)
    assert le.expires_at == t0 + timedelta(seconds=12.5 + 60)
    (attempt,) = lg.attempts(rid)
    assert attempt.started_at == t0 + timedelta(seconds=12.5)
    assert attempt.finished_at == t0 + timedelta(seconds=19.5)
    assert all(t.at.tzinfo is not None for t in hist)


def test_clock_in_another_timezone_is_the_same_instant(lg: Ledger, clock: ManualClock) -> None:
    local = datetime(2031, 2, 3, 12, 0, tzinfo=timezone(timedelta(hours=9)))
    clock.set(local)
    rid = submit(lg, 1)
    (t,) = lg.history(rid)
    assert t.at == local  # aware datetimes compare as instants
    assert t.at.astimezone(UTC) == datetime(2031, 2, 3, 3, 0, tzinfo=UTC)


def test_backwards_clock_never_moves_a_stream_backwards(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 2)
    clock.advance(100)
    lg.start(rid, CONTROLLER)
    a, b = lg.claim(rid, WORKER, limit=2)
    claimed_at = clock()
    clock.advance(-3600)  # NTP step: an hour back
    lg.heartbeat(a)
    lg.accept(a)
    lg.pause(rid, OPERATOR, "hold")  # b is live: pausing
    clock.advance(-86_400)  # and a day further back
    lg.fail_attempt(b, "interrupted")  # ends the last lease: paused
    lg.resume(rid, OPERATOR)
    hist = lg.history(rid)
    streams: dict[str | None, list[datetime]] = {}
    for t in hist:
        streams.setdefault(t.item_id, []).append(t.at)
    for stream, times in streams.items():
        assert times == sorted(times), (stream, times)
    # the item events after the jump carry at least the claim's time
    for t in hist:
        if t.item_id is not None and t.command != "claim":
            assert t.at >= claimed_at, t
    st = lg.status(rid)
    assert st.updated_at >= claimed_at
    assert st.state == S.RUNNING


def test_backwards_clock_keeps_revisions_and_status_monotonic(
    lg: Ledger, clock: ManualClock
) -> None:
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    seen = [lg.status(rid)]
    for step in (-10, -1000, 5, -50_000):
        clock.advance(step)
        lg.pause(rid, OPERATOR, "hold")
        seen.append(lg.status(rid))
        lg.resume(rid, OPERATOR)
        seen.append(lg.status(rid))
    assert [s.updated_at for s in seen] == sorted(s.updated_at for s in seen)
    assert [s.revision for s in seen] == sorted({s.revision for s in seen})


def test_leases_expire_by_the_injected_clock(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 2, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    a, b = lg.claim(rid, WORKER, limit=2)
    clock.advance(29)  # the wall clock is irrelevant: 29 s on the injected one
    assert lg.reconcile().expired_leases == 0
    assert lg.accept(a).state == S.ACCEPTED
    clock.advance(2)  # 31 s after the claim
    n = event_count(lg)
    with pytest.raises(LeaseLost):
        lg.accept(b)
    assert event_count(lg) == n
    assert lg.reconcile().expired_leases == 1
    (item,) = lg.items(rid, state=S.RETRYABLE)
    assert item.item_id == b.item_id
    expired = lg.attempts(rid, b.item_id)[-1]
    assert expired.outcome == "lease_expired"
    assert expired.finished_at == clock()


def test_reconcile_now_argument_may_look_back_never_ahead(lg: Ledger, clock: ManualClock) -> None:
    """rule 14 of the rule book: a `now` later than the store's clock is refused; an earlier one is used."""
    rid = submit(lg, 1, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    le = lg.claim(rid, WORKER)[0]
    with pytest.raises(InvalidInput, match="later than the store's clock"):
        lg.reconcile(now=clock() + timedelta(seconds=31))
    clock.advance(31)
    assert lg.reconcile(now=clock() - timedelta(seconds=21)).expired_leases == 0
    assert lg.reconcile(now=clock()).expired_leases == 1
    with pytest.raises(LeaseLost):
        lg.heartbeat(le)
    with pytest.raises(InvalidInput):
        lg.reconcile(now=datetime(2031, 1, 1))  # naive: refused


def test_a_heartbeat_after_a_backwards_jump_keeps_the_lease_live_on_the_clock_as_it_reads(
    lg: Ledger, clock: ManualClock
) -> None:
    rid = submit(lg, 1, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    clock.advance(1000)
    le = lg.claim(rid, WORKER)[0]
    clock.advance(-1000)  # back to before the item's last event
    extended = lg.heartbeat(le)
    # the lease runs lease_seconds from the heartbeat by the clock as it reads now: its
    # holder keeps it, and a holder that stops beating loses it 30 s on, not 1,030 s
    assert extended.expires_at == clock() + timedelta(seconds=30)
    assert lg.reconcile().expired_leases == 0
    assert lg.accept(le).state == S.ACCEPTED
    times = [t.at for t in lg.history(rid) if t.item_id is not None]
    assert times == sorted(times)


def test_backoff_is_judged_by_the_injected_clock(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 1, backoff_seconds=120)
    lg.start(rid, CONTROLLER)
    le = lg.claim(rid, WORKER)[0]
    lg.fail_attempt(le, "flaky")
    clock.advance(119)
    assert lg.claim(rid, WORKER) == []
    clock.advance(1)
    assert [x.attempt for x in lg.claim(rid, WORKER)] == [2]


def test_naive_clock_is_refused(store_dsn: str) -> None:
    with Ledger.open(store_dsn, clock=lambda: datetime(2031, 1, 1)) as lg:
        with pytest.raises(ValueError, match="aware"):
            lg.submit(manifest(1), SUBMITTER)
        assert event_count(lg) == 0
