"""the rule book "Rules that must hold" 1-9 and 11, each with tests that could fail, on every store.

(Rule 10, disposable projections, has its own suite.)
"""

# Lambdas in loops below are called at once, so late binding is harmless.
# ruff: noqa: B023

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ledger import (
    Actor,
    Conflict,
    IllegalTransition,
    InvalidInput,
    LeaseLost,
    Ledger,
    LedgerError,
    ManifestInvalid,
    NotComplete,
    StaleReview,
)
from ledger.core import states as S
from ledger.core.visibility import fingerprint
from tests.support.clock import ManualClock
from tests.support.drive import DECISION, event_count, item_zoo, run_in, submit
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
)

W2 = Actor("w2", "worker")


def events_via_store(lg: Ledger) -> int:
    """The store's own event log, decoded (a second count beside the SQL COUNT)."""
    return len(lg.store.read_events(0, 1_000_000))


def nothing_written(lg: Ledger, fn: Callable[[], Any], exc: type[LedgerError]) -> LedgerError:
    n_sql, n_log = event_count(lg), events_via_store(lg)
    with pytest.raises(exc) as info:
        fn()
    assert (event_count(lg), events_via_store(lg)) == (n_sql, n_log), "a refusal wrote events"
    return info.value


def claim_one(lg: Ledger, run_id: str, who: Actor = WORKER) -> Any:
    got = lg.claim(run_id, who, limit=1)
    assert len(got) == 1
    return got[0]


# ---------------------------------------------------------------------------
# Rule 1: every transition is an event with run id, item id, from/to, actor, role, reason,
# evidence and time; history is never rewritten
# ---------------------------------------------------------------------------
def test_rule1_every_transition_is_a_complete_event(lg: Ledger, clock: ManualClock) -> None:
    t0 = clock()
    expected: list[tuple[Any, ...]] = []  # (item_id, command, from, to, actor, role, reason, at)

    def step(
        item: str | None,
        command: str,
        frm: str,
        to: str,
        who: Actor | str,
        role: str,
        reason: str | None,
    ) -> None:
        actor_id = who if isinstance(who, str) else who.id
        expected.append((item, command, frm, to, actor_id, role, reason, clock()))

    rid = lg.submit(manifest(3, max_attempts=2), SUBMITTER).run_id
    # the reasons of commands that take none from the caller are the rule book's
    step(None, "submit", S.NEW, S.QUEUED, SUBMITTER, S.SUBMITTER, "submitted")
    clock.advance(1)
    lg.start(rid, CONTROLLER)
    step(None, "start", S.QUEUED, S.RUNNING, CONTROLLER, S.CONTROLLER, "started by controller")
    clock.advance(1)
    a, b, c = lg.claim(rid, WORKER, limit=3)
    for le in (a, b, c):
        why = f"claimed under lease {fingerprint(le.token)}"  # never the token itself
        step(le.item_id, "claim", S.PENDING, S.IN_PROGRESS, WORKER, S.WORKER, why)
    clock.advance(1)
    lg.accept(a, evidence={"rows": 12, "sha": "abc"}, stage="load")
    step(a.item_id, "accept", S.IN_PROGRESS, S.ACCEPTED, WORKER, S.WORKER, "accepted")
    clock.advance(1)
    lg.reject(b, "negative-amount", "row 7 is -3.00", stage="validate")
    step(b.item_id, "reject", S.IN_PROGRESS, S.REJECTED, WORKER, S.WORKER, "negative-amount")
    clock.advance(1)
    lg.fail_attempt(c, "connection reset by peer", stage="fetch", retryable=False)
    step(c.item_id, "fail_attempt", S.IN_PROGRESS, S.QUARANTINED, WORKER, S.WORKER, "not retryable")
    clock.advance(1)
    lg.skip(rid, c.item_id, REVIEWER, "covered by the December run")
    step(
        c.item_id,
        "skip",
        S.QUARANTINED,
        S.SKIPPED,
        REVIEWER,
        S.REVIEWER,
        "covered by the December run",
    )
    clock.advance(1)
    lg.pause(rid, OPERATOR, "maintenance window")
    step(None, "pause", S.RUNNING, S.PAUSED, OPERATOR, S.OPERATOR, "maintenance window")
    clock.advance(1)
    lg.resume(rid, OPERATOR, reason="back to work")
    step(None, "resume", S.PAUSED, S.RUNNING, OPERATOR, S.OPERATOR, "back to work")
    clock.advance(1)
    lg.fail(
        rid,
        CONTROLLER,
        "the source export vanished",
        transient=False,
        failure_reason="input_unavailable",
    )
    step(None, "fail", S.RUNNING, S.FAILED, CONTROLLER, S.CONTROLLER, "the source export vanished")

    history = lg.history(rid)
    got = [
        (t.item_id, t.command, t.from_state, t.to_state, t.actor_id, t.role, t.reason, t.at)
        for t in history
    ]
    assert got == expected
    assert all(t.run_id == rid for t in history)
    assert history[0].at == t0
    # positions are the global order; revisions count each stream's own events
    assert [t.position for t in history] == sorted({t.position for t in history})
    run_revisions = [t.revision for t in history if t.item_id is None]
    assert run_revisions == sorted(set(run_revisions))
    assert lg.status(rid).revision == run_revisions[-1]
    # evidence travels with the event
    by = {(t.item_id, t.command): t for t in history}
    assert by[(a.item_id, "accept")].evidence["evidence"] == {"rows": 12, "sha": "abc"}
    assert by[(a.item_id, "accept")].evidence["lease_token"] == a.token
    assert by[(a.item_id, "claim")].evidence["lease_token"] == a.token
    assert by[(b.item_id, "reject")].evidence["rule"] == "negative-amount"
    assert by[(c.item_id, "fail_attempt")].evidence["error"] == "connection reset by peer"
    fail = by[(None, "fail")]
    assert (fail.evidence["failure_kind"], fail.evidence["failure_reason"]) == (
        S.PERMANENT,
        "input_unavailable",
    )
    # each transition is an event in the store: the store holds at least one per transition,
    # and the audit view agrees with the history
    assert event_count(lg) >= len(history)
    assert list(lg.audit(run_id=rid)) == history


def test_rule1_history_is_never_rewritten(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 3)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    lg.fail_attempt(le, "timeout")
    early = lg.history(rid)
    with lg.store.read() as tx:
        early_rows = lg.store.read_stored_rows(tx, 0, 1_000_000)
    clock.advance(5)
    for le in lg.claim(rid, WORKER, limit=5):
        lg.accept(le)
    lg.complete(rid, CONTROLLER)
    later = lg.history(rid)
    assert later[: len(early)] == early
    assert len(later) > len(early)
    with lg.store.read() as tx:
        later_rows = lg.store.read_stored_rows(tx, 0, 1_000_000)
    assert [
        (p, e.originator_id, e.originator_version, e.topic, bytes(e.state))
        for p, e in later_rows[: len(early_rows)]
    ] == [
        (p, e.originator_id, e.originator_version, e.topic, bytes(e.state)) for p, e in early_rows
    ]


# ---------------------------------------------------------------------------
# Rule 2: compare-and-set on the revision the caller read
# ---------------------------------------------------------------------------
RUN_CAS: dict[str, Callable[[Ledger, str, int], Any]] = {
    "start": lambda lg, rid, rev: lg.start(rid, CONTROLLER, expected_revision=rev),
    "pause": lambda lg, rid, rev: lg.pause(rid, OPERATOR, "hold", expected_revision=rev),
    "cancel": lambda lg, rid, rev: lg.cancel(rid, OPERATOR, "stop", expected_revision=rev),
    "amend": lambda lg, rid, rev: lg.amend(
        rid, SUBMITTER, "more", items=[{"item_id": "n"}], expected_revision=rev
    ),
    "request_review": lambda lg, rid, rev: lg.request_review(
        rid, CONTROLLER, DECISION, expected_revision=rev
    ),
    "fail": lambda lg, rid, rev: lg.fail(
        rid, CONTROLLER, "x", transient=True, expected_revision=rev
    ),
    "complete": lambda lg, rid, rev: lg.complete(rid, CONTROLLER, expected_revision=rev),
    "claim": lambda lg, rid, rev: lg.claim(rid, WORKER, expected_revision=rev),
}
CAS_STATE = {"start": S.QUEUED}


def test_rule2_stale_revision_is_a_conflict(lg: Ledger) -> None:
    for command in sorted(RUN_CAS):
        d = run_in(lg, CAS_STATE.get(command, S.RUNNING))
        st = lg.status(d.run_id)
        for stale in (st.revision - 1, st.revision + 1):
            e = nothing_written(lg, lambda: RUN_CAS[command](lg, d.run_id, stale), Conflict)
            assert isinstance(e, Conflict)
            assert (e.current_revision, e.current_state) == (st.revision, st.state), command
            assert str(st.revision) in e.message
            assert e.to_dict()["current_revision"] == st.revision
        after = lg.status(d.run_id)
        assert (after.state, after.revision) == (st.state, st.revision), command


def test_rule2_current_revision_is_accepted_and_advances(lg: Ledger) -> None:
    rid = submit(lg, 2)
    rev = lg.status(rid).revision
    st = lg.start(rid, CONTROLLER, expected_revision=rev)
    assert st.revision > rev
    st2 = lg.pause(rid, OPERATOR, "hold", expected_revision=st.revision)
    assert st2.revision > st.revision
    # a caller still holding the older revision is refused
    nothing_written(
        lg,
        lambda: lg.resume(rid, OPERATOR, expected_revision=st.revision, reason="back to work"),
        Conflict,
    )
    assert (
        lg.resume(rid, OPERATOR, expected_revision=st2.revision, reason="back to work").state
        == S.RUNNING
    )


def test_rule2_item_commands_compare_the_item_revision(lg: Ledger) -> None:
    zoo = item_zoo(lg)
    item = {i.item_id: i for i in lg.items(zoo.run_id)}[S.QUARANTINED]
    e = nothing_written(
        lg,
        lambda: lg.release(
            zoo.run_id, S.QUARANTINED, OPERATOR, "fixed", expected_revision=item.revision + 1
        ),
        Conflict,
    )
    assert isinstance(e, Conflict)
    assert (e.current_revision, e.current_state) == (item.revision, S.QUARANTINED)
    st = lg.release(zoo.run_id, S.QUARANTINED, OPERATOR, "fixed", expected_revision=item.revision)
    assert st.state == S.RETRYABLE and st.revision > item.revision


def test_rule2_concurrent_writers_never_both_succeed(lg: Ledger) -> None:
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    threads_n = 4
    for round_ in range(3):
        rev = lg.status(rid).revision
        barrier = threading.Barrier(threads_n)
        results: list[str] = []
        lock = threading.Lock()

        def writer(k: int, rev: int = rev, round_: int = round_) -> None:
            barrier.wait()
            try:
                lg.amend(
                    rid,
                    SUBMITTER,
                    f"round {round_} writer {k}",
                    items=[{"item_id": f"r{round_}-w{k}"}],
                    expected_revision=rev,
                )
                outcome = "ok"
            except Conflict:
                outcome = "conflict"
            except Exception as e:
                outcome = f"error {type(e).__name__}: {e}"
            with lock:
                results.append(outcome)

        ts = [threading.Thread(target=writer, args=(k,)) for k in range(threads_n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(results) == ["conflict"] * (threads_n - 1) + ["ok"], results
        assert lg.status(rid).revision == rev + 1
    added = [i.item_id for i in lg.items(rid) if i.item_id.startswith("r")]
    assert len(added) == 3


def test_rule2_identity_fixed_revisions_and_times_monotonic(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 2)
    seen = [lg.status(rid)]

    def record() -> None:
        seen.append(lg.status(rid))

    clock.advance(1)
    lg.start(rid, CONTROLLER)
    record()
    clock.advance(1)
    le = claim_one(lg, rid)
    record()
    clock.set(clock() - timedelta(hours=1))  # the clock steps backwards
    lg.accept(le)
    record()
    lg.pause(rid, OPERATOR, "hold")
    record()
    clock.advance(7200)
    lg.resume(rid, OPERATOR, reason="back to work")
    record()
    ident = {
        (s.run_id, s.created_at, s.created_by, s.source_version, s.config_version, s.root_run_id)
        for s in seen
    }
    assert len(ident) == 1
    revs = [s.revision for s in seen]
    assert revs == sorted(revs) and len(set(revs)) >= 4
    updated = [s.updated_at for s in seen]
    assert updated == sorted(updated)


# ---------------------------------------------------------------------------
# Rule 3: leases fence workers
# ---------------------------------------------------------------------------
def test_rule3_wrong_token_is_lease_lost(lg: Ledger) -> None:
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    forged = replace(le, token="0" * 32)
    for fn in (
        lambda: lg.accept(forged),
        lambda: lg.heartbeat(forged),
        lambda: lg.reject(forged, "bad-row"),
        lambda: lg.fail_attempt(forged, "x"),
    ):
        nothing_written(lg, fn, LeaseLost)
    assert lg.accept(le).state == S.ACCEPTED


def test_rule3_expired_lease_cannot_write_even_before_the_reconciler(
    lg: Ledger, clock: ManualClock
) -> None:
    rid = submit(lg, 1, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    clock.advance(31)
    for fn in (lambda: lg.accept(le), lambda: lg.heartbeat(le)):
        e = nothing_written(lg, fn, LeaseLost)
        assert "expired" in e.message
    item = lg.items(rid)[0]
    assert item.state == S.IN_PROGRESS  # the record lags; it never leads


def test_rule3_heartbeat_extends_the_lease(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 1, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    for _ in range(4):  # 4 x 20 s: well past the first expiry
        clock.advance(20)
        n = event_count(lg)
        extended = lg.heartbeat(le)
        assert event_count(lg) == n + 1  # a heartbeat is recorded
        assert extended.expires_at == clock() + timedelta(seconds=30)
        assert lg.items(rid)[0].lease.expires_at == extended.expires_at  # type: ignore[union-attr]
    assert lg.reconcile().expired_leases == 0
    assert lg.accept(le).state == S.ACCEPTED
    attempt = lg.attempts(rid)[0]
    assert attempt.expires_at == clock() + timedelta(seconds=30)


def test_rule3_taken_over_lease_is_fenced(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 1, lease_seconds=30)
    lg.start(rid, CONTROLLER)
    old = claim_one(lg, rid, WORKER)
    clock.advance(31)
    assert lg.reconcile().expired_leases == 1
    new = claim_one(lg, rid, W2)
    assert new.token != old.token and new.attempt == old.attempt + 1
    # the old holder wakes up: every write is refused, nothing written
    for fn in (
        lambda: lg.accept(old),
        lambda: lg.heartbeat(old),
        lambda: lg.fail_attempt(old, "late"),
    ):
        e = nothing_written(lg, fn, LeaseLost)
        assert "another lease" in e.message
    assert lg.accept(new).state == S.ACCEPTED
    attempts = lg.attempts(rid)
    assert [(a.worker_id, a.outcome) for a in attempts] == [
        ("w1", "lease_expired"),
        ("w2", "accepted"),
    ]
    assert attempts[0].finished_at is not None
    assert attempts[0].finished_at <= attempts[1].started_at


def test_rule3_never_two_live_leases(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 4, lease_seconds=10)
    lg.start(rid, CONTROLLER)
    first = lg.claim(rid, WORKER, limit=10)
    assert len(first) == 4
    # a second worker finds nothing while the leases are live, expired or not yet reconciled
    assert lg.claim(rid, W2, limit=10) == []
    clock.advance(11)
    assert lg.claim(rid, W2, limit=10) == []
    lg.reconcile()
    second = lg.claim(rid, W2, limit=10)
    assert len(second) == 4
    leased = [i.lease for i in lg.items(rid)]
    assert all(le is not None for le in leased)
    assert {le.token for le in leased if le} == {le.token for le in second}
    for item_id in {le.item_id for le in first}:
        atts = lg.attempts(rid, item_id)
        live = [a for a in atts if a.finished_at is None]
        assert len(live) == 1


# ---------------------------------------------------------------------------
# Rule 4: truthfulness
# ---------------------------------------------------------------------------
def test_rule4_reconcile_never_accepts_or_succeeds(lg: Ledger, clock: ManualClock) -> None:
    done = submit(lg, 2)
    lg.start(done, CONTROLLER)
    for le in lg.claim(done, WORKER, limit=2):
        lg.accept(le)
    stale = submit(lg, 2, lease_seconds=5, max_attempts=1)
    lg.start(stale, CONTROLLER)
    lg.claim(stale, WORKER, limit=2)
    clock.advance(3600)
    for _ in range(2):
        lg.reconcile()
    # every item of `done` is accepted, but only the controller may complete it
    assert lg.status(done).state == S.RUNNING
    assert lg.status(done).waiting_on == "controller"
    assert {i.state for i in lg.items(stale)} == {S.QUARANTINED}
    for t in lg.audit(role=S.RECONCILER):
        assert t.to_state not in (S.ACCEPTED, S.SUCCEEDED, S.COMPLETED_WITH_ERRORS), t


def test_rule4_run_deadline_fails_only_once_no_lease_is_live(
    lg: Ledger, clock: ManualClock
) -> None:
    rid = submit(lg, 2, run_deadline_seconds=60, lease_seconds=300)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    clock.advance(120)  # deadline passed, lease live
    report = lg.reconcile()
    assert report.failed_runs == 0
    assert lg.status(rid).state == S.RUNNING
    # the worker may still finish
    lg.accept(le)
    report = lg.reconcile()
    assert report.failed_runs == 1
    st = lg.status(rid)
    assert (st.state, st.failure_kind, st.failure_reason) == (
        S.FAILED,
        S.TRANSIENT,
        "deadline_exceeded",
    )
    # the accepted item stays accepted
    assert {i.item_id: i.state for i in lg.items(rid)}[le.item_id] == S.ACCEPTED


def test_rule4_run_deadline_not_passed_does_nothing(lg: Ledger, clock: ManualClock) -> None:
    rid = submit(lg, 1, run_deadline_seconds=60)
    lg.start(rid, CONTROLLER)
    clock.advance(59)
    n = event_count(lg)
    assert lg.reconcile().failed_runs == 0
    assert event_count(lg) == n
    assert lg.status(rid).state == S.RUNNING


# ---------------------------------------------------------------------------
# Rule 5: success is earned
# ---------------------------------------------------------------------------
def _finish(lg: Ledger, rid: str, outcomes: dict[str, str]) -> None:
    """Claim everything and record `outcomes` (item -> accept/reject/quarantine/leave)."""
    for le in lg.claim(rid, WORKER, limit=1000):
        what = outcomes.get(le.item_id, "accept")
        if what == "accept":
            lg.accept(le)
        elif what == "reject":
            lg.reject(le, "bad-row", f"{le.item_id} is malformed")
        elif what == "quarantine":
            lg.fail_attempt(le, "poison message", retryable=False)
        elif what == "retry":
            lg.fail_attempt(le, "flaky")


def test_rule5_complete_names_open_work(lg: Ledger) -> None:
    rid = submit(lg, 4, backoff_seconds=600)
    lg.start(rid, CONTROLLER)
    leases = lg.claim(rid, WORKER, limit=2)
    lg.fail_attempt(leases[0], "flaky")  # retryable
    # pending 2, in_progress 1, retryable 1
    e = nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), NotComplete)
    for word in ("2 pending", "1 in_progress", "1 retryable"):
        assert word in e.message, e.message
    assert lg.status(rid).state == S.RUNNING  # complete never writes failed


def test_rule5_required_not_accepted_without_partial_delivery(lg: Ledger) -> None:
    rid = submit(lg, 3)
    lg.start(rid, CONTROLLER)
    _finish(lg, rid, {"i1": "reject", "i2": "quarantine"})
    e = nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), NotComplete)
    assert "i1" in e.message and "i2" in e.message and "partial_delivery=False" in e.message
    st = lg.status(rid)
    assert st.state == S.RUNNING and st.failure_kind is None


def test_rule5_optional_items_do_not_block_success(lg: Ledger) -> None:
    m = manifest(2)
    m["items"].append({"item_id": "nice-to-have", "required": False})
    rid = lg.submit(m, SUBMITTER).run_id
    lg.start(rid, CONTROLLER)
    _finish(lg, rid, {"nice-to-have": "reject"})
    st = lg.complete(rid, CONTROLLER)
    assert st.state == S.SUCCEEDED


TOLERATED_CASES: list[tuple[int | str, int, int, str | None]] = [
    (1, 4, 1, S.COMPLETED_WITH_ERRORS),
    (1, 4, 2, None),
    (0, 3, 1, None),
    ("50%", 4, 2, S.COMPLETED_WITH_ERRORS),
    ("25%", 10, 2, S.COMPLETED_WITH_ERRORS),  # 2.5 rounds down to 2
    ("25%", 10, 3, None),
    ("20%", 4, 1, None),  # 0.8 rounds down to 0
]


def test_rule5_tolerated_failures(lg: Ledger) -> None:
    for tolerated, required, bad, expected in TOLERATED_CASES:
        _tolerated_case(lg, tolerated, required, bad, expected)


def _tolerated_case(
    lg: Ledger, tolerated: int | str, required: int, bad: int, expected: str | None
) -> None:
    case = (tolerated, required, bad, expected)
    rid = submit(lg, required, partial_delivery=True, tolerated_failures=tolerated)
    lg.start(rid, CONTROLLER)
    kinds = ["reject", "quarantine"]
    outcomes = {f"i{k}": kinds[k % 2] for k in range(bad)}
    _finish(lg, rid, outcomes)
    if expected is None:
        e = nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), NotComplete)
        assert f"{bad} required items not accepted" in e.message, (case, e.message)
        for item_id in outcomes:
            assert item_id in e.message, case
        assert lg.status(rid).state == S.RUNNING
        return
    st = lg.complete(rid, CONTROLLER)
    assert st.state == expected, case
    # the status lists which items were not accepted and why
    assert [(n.item_id, n.state) for n in st.not_accepted] == [
        (f"i{k}", S.REJECTED if kinds[k % 2] == "reject" else S.QUARANTINED) for k in range(bad)
    ]
    assert all(n.reason for n in st.not_accepted)
    assert st.not_accepted[0].reason == "bad-row"


def test_rule5_review_approval_for_current_input_version(lg: Ledger) -> None:
    rid = submit(lg, 2, review={"decision": DECISION})
    lg.start(rid, CONTROLLER)
    _finish(lg, rid, {})
    version = lg.status(rid).input_version
    e = nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), NotComplete)
    assert DECISION in e.message and version in e.message
    lg.request_review(rid, CONTROLLER, DECISION)
    nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), IllegalTransition)
    lg.decide(rid, REVIEWER, version, True, "numbers match")
    assert lg.complete(rid, CONTROLLER).state == S.SUCCEEDED


# ---------------------------------------------------------------------------
# Rule 6: cancellation is durable intent
# ---------------------------------------------------------------------------
def test_rule6_cancel_is_durable_across_a_restart(store_dsn: str, clock: ManualClock) -> None:
    if store_dsn.startswith("memory://"):
        pytest.skip("a memory store does not outlive its Ledger")
    with Ledger.open(store_dsn, clock=clock) as lg:
        rid = submit(lg, 4)
        lg.start(rid, CONTROLLER)
        a, b = lg.claim(rid, WORKER, limit=2)
        out = lg.cancel(rid, SUBMITTER, "wrong month")
        assert (out.state, out.in_flight, out.already) == (S.CANCELING, 2, False)
    # the owner restarts
    with Ledger.open(store_dsn, clock=clock) as lg:
        st = lg.status(rid)
        assert (st.state, st.cancel_requested) == (S.CANCELING, True)
        assert st.waiting_on == "workers"
        e = nothing_written(lg, lambda: lg.claim(rid, W2, limit=5), IllegalTransition)
        assert S.CANCELING in e.message
        out = lg.cancel(rid, OPERATOR, "again")
        assert (out.state, out.already) == (S.CANCELING, True)
        # in-flight outcomes are kept
        assert lg.accept(a).state == S.ACCEPTED
        assert lg.status(rid).state == S.CANCELING
        lg.fail_attempt(b, "interrupted")  # the last live lease ends: canceled in that txn
        st = lg.status(rid)
        assert st.state == S.CANCELED and st.waiting_on == "nobody"
        items = {i.item_id: i for i in lg.items(rid)}
        assert items[a.item_id].state == S.ACCEPTED
        assert items[b.item_id].state == S.SKIPPED and items[b.item_id].reason == "canceled"
        for other in set(items) - {a.item_id, b.item_id}:
            assert (items[other].state, items[other].reason) == (S.SKIPPED, "canceled")
        hist = lg.history(rid)
        last = hist[-1]
        assert (last.command, last.from_state, last.to_state) == (
            "cancel_finished",
            S.CANCELING,
            S.CANCELED,
        )


def test_rule6_cancel_without_leases_is_immediate(lg: Ledger) -> None:
    zoo = item_zoo(lg)
    lease = zoo.leases[S.IN_PROGRESS]
    lg.accept(lease)  # no lease is live now
    out = lg.cancel(zoo.run_id, OPERATOR, "stop")
    assert (out.state, out.in_flight) == (S.CANCELED, 0)
    states = {i.item_id: (i.state, i.reason) for i in lg.items(zoo.run_id)}
    assert states[S.PENDING] == (S.SKIPPED, "canceled")
    assert states[S.RETRYABLE] == (S.SKIPPED, "canceled")
    assert states[S.QUARANTINED][0] == S.QUARANTINED
    assert states[S.ACCEPTED][0] == S.ACCEPTED and states[S.REJECTED][0] == S.REJECTED


def test_rule6_reconciler_finishes_a_cancel(lg: Ledger, clock: ManualClock) -> None:
    d = run_in(lg, S.CANCELING, lease_seconds=30)
    clock.advance(31)
    report = lg.reconcile()
    assert (report.expired_leases, report.finished_cancels) == (1, 1)
    assert lg.status(d.run_id).state == S.CANCELED
    assert {i.state for i in lg.items(d.run_id)} == {S.SKIPPED}
    nothing_written(lg, lambda: lg.accept(d.leases[0]), LeaseLost)


def test_rule6_cancel_retries_on_a_revision_conflict(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without expected_revision a cancel re-reads and retries on Conflict, a bounded number
    of times; with expected_revision it does not. (A conflict is injected: the store's locks
    make a real one rare.)"""
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    from ledger.commands import runs

    real = runs.cancel_once
    calls = {"n": 0, "fail": 1}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= calls["fail"]:
            raise Conflict("injected", current_revision=0, current_state=S.RUNNING)
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "cancel_once", flaky)
    rev = lg.status(rid).revision
    with pytest.raises(Conflict):
        lg.cancel(rid, OPERATOR, "stop", expected_revision=rev)
    assert calls["n"] == 1
    calls.update(n=0, fail=1)
    assert lg.cancel(rid, OPERATOR, "stop").state == S.CANCELED
    assert calls["n"] == 2
    rid2 = submit(lg, 1)
    calls.update(n=0, fail=10_000)
    with pytest.raises(Conflict):
        lg.cancel(rid2, OPERATOR, "stop")
    assert 1 < calls["n"] < 100
    assert lg.status(rid2).state == S.QUEUED


# ---------------------------------------------------------------------------
# Rule 7: review is bound to an input version
# ---------------------------------------------------------------------------
def test_rule7_request_review_records_decision_and_version(lg: Ledger) -> None:
    rid = submit(lg, 1, review={"decision": DECISION})
    lg.start(rid, CONTROLLER)
    version = lg.status(rid).input_version
    st = lg.request_review(rid, CONTROLLER, DECISION)
    assert st.state == S.AWAITING_REVIEW and st.waiting_on == "reviewer"
    t = lg.history(rid)[-1]
    assert t.evidence["decision"] == DECISION and t.evidence["input_version"] == version
    # a decision the policy does not ask for is refused
    rid2 = submit(lg, 1, review={"decision": DECISION})
    lg.start(rid2, CONTROLLER)
    e = nothing_written(lg, lambda: lg.request_review(rid2, CONTROLLER, "other-gate"), InvalidInput)
    assert "other-gate" in e.message


def test_rule7_amend_while_awaiting_review_rebinds(lg: Ledger) -> None:
    rid = submit(lg, 1, review={"decision": DECISION})
    lg.start(rid, CONTROLLER)
    lg.request_review(rid, CONTROLLER, DECISION)
    v1 = lg.status(rid).input_version
    st = lg.amend(rid, SUBMITTER, "one more invoice", items=[{"item_id": "late"}])
    v2 = st.input_version
    assert v2 != v1
    assert st.state == S.AWAITING_REVIEW
    e = nothing_written(lg, lambda: lg.decide(rid, REVIEWER, v1, True, "ok"), StaleReview)
    assert isinstance(e, StaleReview) and e.expected_version == v2
    assert v1 in e.message and v2 in e.message
    assert lg.status(rid).state == S.AWAITING_REVIEW
    assert lg.decide(rid, REVIEWER, v2, True, "ok").state == S.RUNNING
    _finish(lg, rid, {})
    assert lg.complete(rid, CONTROLLER).state == S.SUCCEEDED


@pytest.mark.parametrize("survives", [False, True])
def test_rule7_approval_before_an_amend(lg: Ledger, survives: bool) -> None:
    rid = submit(lg, 1, review={"decision": DECISION, "survives_amendment": survives})
    lg.start(rid, CONTROLLER)
    lg.request_review(rid, CONTROLLER, DECISION)
    v1 = lg.status(rid).input_version
    lg.decide(rid, REVIEWER, v1, True, "ok")
    st = lg.amend(rid, OPERATOR, "replace the payload", items=[{"item_id": "i0", "payload": 2}])
    v2 = st.input_version
    assert v2 != v1
    _finish(lg, rid, {})
    # a replaced payload voids the approval even when it survives amendments (rule 13)
    e = nothing_written(lg, lambda: lg.complete(rid, CONTROLLER), NotComplete)
    assert v2 in e.message
    lg.request_review(rid, CONTROLLER, DECISION)
    nothing_written(lg, lambda: lg.decide(rid, REVIEWER, v1, True, "ok"), StaleReview)
    lg.decide(rid, REVIEWER, v2, True, "ok again")
    assert lg.complete(rid, CONTROLLER).state == S.SUCCEEDED


# ---------------------------------------------------------------------------
# Rule 8: repairs are linked runs; retry replays the latest input exactly
# ---------------------------------------------------------------------------
def test_rule8_retry_replays_latest_input_exactly(lg: Ledger) -> None:
    m = manifest(3, max_attempts=4)
    m["items"][1]["payload"] = {"amount": "12.50", "tags": ["a", "é"]}
    m["items"][2]["required"] = False
    rid = lg.submit(m, SUBMITTER).run_id
    lg.start(rid, CONTROLLER)
    lg.amend(
        rid,
        SUBMITTER,
        "fix i1, add i9, drop i0, longer leases",
        items=[
            {"item_id": "i1", "payload": {"amount": "13.00"}},
            {"item_id": "i9", "payload": [1, 2, 3]},
        ],
        withdraw=["i0"],
        policy={"lease_seconds": 120},
    )
    le = claim_one(lg, rid)
    lg.accept(le)
    lg.fail(rid, CONTROLLER, "source flaked", transient=True, failure_reason="input_unavailable")
    original = lg.status(rid)
    original_items = lg.items(rid)
    original_history = lg.history(rid)
    n_events = event_count(lg)

    new = lg.retry(rid, OPERATOR)
    assert new.state == S.QUEUED
    assert [(ln.relation, ln.run_id) for ln in new.links] == [("retry_of", rid)]
    assert (new.source_version, new.config_version, new.scope) == (
        original.source_version,
        original.config_version,
        original.scope,
    )
    assert new.input_version == original.input_version
    assert new.policy == original.policy and new.policy["lease_seconds"] == 120
    assert [(i.item_id, i.required, i.payload, i.state) for i in lg.items(new.run_id)] == [
        ("i1", True, {"amount": "13.00"}, S.PENDING),
        ("i2", False, {"n": 2}, S.PENDING),
        ("i9", True, [1, 2, 3], S.PENDING),
    ]
    # the original stays as it was (its reverse link is a projection, not a new event of it)
    after = lg.status(rid)
    assert (after.state, after.revision, after.input_version, after.failure_kind) == (
        original.state,
        original.revision,
        original.input_version,
        original.failure_kind,
    )
    assert lg.items(rid) == original_items
    assert lg.history(rid) == original_history
    assert event_count(lg) == n_events + 1  # only the new run's submit
    assert ("retried_by", new.run_id) in [(ln.relation, ln.run_id) for ln in after.links]


def test_rule8_lineage_and_links(lg: Ledger) -> None:
    root = run_in(lg, S.FAILED, n=3).run_id
    r1 = lg.retry(root, SUBMITTER).run_id
    lg.start(r1, CONTROLLER)
    _finish(lg, r1, {"i0": "reject"})
    lg.fail(r1, CONTROLLER, "i0 is bad", transient=False, failure_reason="input_invalid")
    nothing_written(lg, lambda: lg.retry(r1, SUBMITTER), IllegalTransition)
    r2 = lg.repair(r1, OPERATOR).run_id  # default: the items not accepted
    assert [i.item_id for i in lg.items(r2)] == ["i0"]
    r3 = lg.repair(r1, OPERATOR, corrections=[{"item_id": "i0", "payload": {"fixed": True}}])
    assert [(ln.relation, ln.run_id) for ln in r3.links] == [("correction_of", r1)]
    assert [i.payload for i in lg.items(r3.run_id)] == [{"fixed": True}]
    r4 = lg.compensate(r1, OPERATOR, "undo the rows already loaded")
    assert [(ln.relation, ln.run_id) for ln in r4.links] == [("compensates", r1)]
    assert sorted(i.item_id for i in lg.items(r4.run_id)) == ["i1", "i2"]  # its accepted items
    lineage = [s.run_id for s in lg.lineage(r2)]
    assert lineage == [root, r1, r2, r3.run_id, r4.run_id]
    for rid in lineage:
        assert lg.status(rid).root_run_id == root
        assert [s.run_id for s in lg.lineage(rid)] == lineage
    assert [(ln.relation, ln.run_id) for ln in lg.status(r2).links] == [("repair_of", r1)]


# ---------------------------------------------------------------------------
# Rule 9: status is accepted state
# ---------------------------------------------------------------------------
def test_rule9_counts_and_fields(lg: Ledger) -> None:
    zoo = item_zoo(lg)
    st = lg.status(zoo.run_id)
    assert st.counts == {s: 1 for s in S.ITEM_STATES}
    assert (st.state, st.failure_kind, st.failure_reason) == (S.RUNNING, None, None)
    assert st.input_version.startswith("sha256:")
    assert st.revision == [t for t in lg.history(zoo.run_id) if t.item_id is None][-1].revision
    assert [n.item_id for n in st.not_accepted] == [S.SKIPPED, S.QUARANTINED, S.REJECTED]
    assert st.cancel_requested is False and st.links == []
    assert st.waiting_on == "workers"


def test_rule9_summary_is_the_latest_reason(lg: Ledger) -> None:
    rid = submit(lg, 1)
    assert lg.status(rid).summary == "submitted"
    lg.start(rid, CONTROLLER)
    assert lg.status(rid).summary == "started by controller"
    lg.pause(rid, OPERATOR, "maintenance window")
    assert lg.status(rid).summary == "maintenance window"
    lg.resume(rid, OPERATOR, reason="back to work")
    assert lg.status(rid).summary == "back to work"


def test_rule9_summary_is_bounded_utf8(lg: Ledger) -> None:
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    for char in ("é", "€", "𝄞"):  # 2, 3 and 4 bytes
        _bounded(lg, rid, char)
        lg.resume(rid, OPERATOR, reason="back to work")


def _bounded(lg: Ledger, rid: str, char: str) -> None:
    reason = char * (4000 // len(char.encode()))  # under the 4 KiB reason limit
    assert len(reason.encode()) > 1024
    lg.pause(rid, OPERATOR, reason)
    summary = lg.status(rid).summary
    assert 0 < len(summary.encode("utf-8")) <= 1024
    assert summary.rstrip(".") and set(summary.rstrip(".")) == {char}
    assert len(summary.encode()) > 1000  # bounded, not emptied
    assert lg.history(rid)[-1].reason == reason  # the event keeps the whole reason


def test_rule9_not_accepted_first_20(lg: Ledger) -> None:
    rid = submit(lg, 25)
    lg.start(rid, CONTROLLER)
    for k in range(25):
        lg.skip(rid, f"i{k}", OPERATOR, f"skip {k}")
    st = lg.status(rid)
    assert [n.item_id for n in st.not_accepted] == [f"i{k}" for k in range(20)]
    assert all(n.state == S.SKIPPED and n.required for n in st.not_accepted)
    assert st.not_accepted[3].reason == "skip 3"
    assert st.counts[S.SKIPPED] == 25


def test_rule9_waiting_on(lg: Ledger, clock: ManualClock) -> None:
    def w(rid: str) -> str:
        return lg.status(rid).waiting_on

    queued = submit(lg, 2)
    assert w(queued) == "controller"
    running = submit(lg, 2)
    lg.start(running, CONTROLLER)
    assert w(running) == "workers"  # claimable
    leases = lg.claim(running, WORKER, limit=2)
    assert w(running) == "workers"  # leased
    lg.accept(leases[0])
    lg.fail_attempt(leases[1], "poison", retryable=False)
    assert w(running) == "reviewer"  # only quarantined left
    lg.skip(running, leases[1].item_id, REVIEWER, "accept the loss")
    assert w(running) == "controller"  # every item final
    canceling = run_in(lg, S.CANCELING)
    assert w(canceling.run_id) == "workers"
    assert w(run_in(lg, S.AWAITING_REVIEW).run_id) == "reviewer"
    assert w(run_in(lg, S.PAUSED).run_id) == "operator"
    for state in S.TERMINAL_RUN_STATES:
        assert w(run_in(lg, state).run_id) == "nobody", state


# ---------------------------------------------------------------------------
# Rule 11: bad input is refused clearly, nothing written
# ---------------------------------------------------------------------------
def _bad(**changes: Any) -> dict[str, Any]:
    m = manifest(2)
    for path, value in changes.items():
        target: Any = m
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if value is _DROP:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return m


_DROP = object()

MANIFEST_CASES = [
    (_bad(source_version=_DROP), "source_version"),
    (_bad(items=[]), "items"),
    (_bad(colour="red"), "colour"),
    (_bad(items__0__payload={"blob": "x" * (64 * 1024)}), "items.0.payload"),
    (_bad(items__1__item_id="i0"), "items"),
    (_bad(items__0__required="yes"), "items.0.required"),
    (_bad(policy={"max_attempts": 0}), "policy.max_attempts"),
    (_bad(policy={"lease_seconds": -1}), "policy.lease_seconds"),
    (_bad(policy={"tolerated_failures": 2}), "policy"),
    (
        _bad(policy={"partial_delivery": True, "tolerated_failures": "150%"}),
        "policy.tolerated_failures",
    ),
    (_bad(policy={"review": {"decision": "x", "extra": 1}}), "policy.review.extra"),
]


def test_rule11_bad_manifest_names_the_field(lg: Ledger) -> None:
    for bad, field in MANIFEST_CASES:
        e = nothing_written(lg, lambda: lg.submit(bad, SUBMITTER), ManifestInvalid)
        assert isinstance(e, ManifestInvalid)
        assert e.field.startswith(field), (field, e.field, e.message)
        assert e.field in e.message, (field, e.message)
    assert lg.runs() == []


def test_rule11_manifest_as_bad_json_and_oversized(lg: Ledger) -> None:
    e = nothing_written(lg, lambda: lg.submit('{"items": [', SUBMITTER), ManifestInvalid)
    assert "JSON" in e.message
    big = '{"pad": "' + "x" * (16 * 1024 * 1024) + '"}'
    e = nothing_written(lg, lambda: lg.submit(big, SUBMITTER), ManifestInvalid)
    assert "16777216" in e.message or "16 MiB" in e.message
    nothing_written(lg, lambda: lg.submit([1, 2], SUBMITTER), ManifestInvalid)  # type: ignore[arg-type]
    assert lg.runs() == []


def test_rule11_bad_command_arguments_name_the_argument(lg: Ledger) -> None:
    rid = submit(lg, 2)
    lg.start(rid, CONTROLLER)
    le = claim_one(lg, rid)
    cases: list[tuple[Callable[[], Any], str, str | None]] = [
        (lambda: lg.start(rid, Actor("ctl", "boss")), "role", "controller"),
        (lambda: lg.start(rid, Actor("", "controller")), "actor.id", None),
        (lambda: lg.start(rid, "ctl"), "ID:ROLE", None),  # type: ignore[arg-type]
        (lambda: lg.claim(rid, WORKER, limit=0), "limit", "1"),
        (lambda: lg.claim(rid, WORKER, limit=True), "limit", None),  # type: ignore[arg-type]
        (
            lambda: lg.pause(rid, OPERATOR, "hold", expected_revision=-1),
            "expected_revision",
            "non-negative",
        ),
        (
            lambda: lg.fail(rid, CONTROLLER, "x", transient=True, failure_reason="meh"),
            "failure_reason",
            "input_unavailable",
        ),
        (lambda: lg.fail(rid, CONTROLLER, "x", transient="yes"), "transient", None),  # type: ignore[arg-type]
        (lambda: lg.fail(rid, CONTROLLER, "", transient=True), "reason", None),
        (lambda: lg.pause(rid, OPERATOR, "x" * 5000), "reason", "4096"),
        (lambda: lg.pause(rid, OPERATOR, "bell\x07"), "reason", None),
        (lambda: lg.accept(le, evidence=["not", "a", "dict"]), "evidence", None),  # type: ignore[arg-type]
        (lambda: lg.accept(le, evidence={"blob": "x" * 70_000}), "evidence", "64 KiB"),
        (lambda: lg.accept("token"), "lease", None),  # type: ignore[arg-type]
        (lambda: lg.fail_attempt(le, 42), "error", None),  # type: ignore[arg-type]
        (lambda: lg.decide(rid, REVIEWER, "v", "yes", "r"), "approve", None),  # type: ignore[arg-type]
        (lambda: lg.amend(rid, SUBMITTER, "nothing"), "amend", None),
        (
            lambda: lg.amend(rid, SUBMITTER, "bad", items=[{"item_id": "x", "colour": 1}]),
            "items.0.colour",
            None,
        ),
        (
            lambda: lg.amend(rid, SUBMITTER, "bad", policy={"max_attempts": "many"}),
            "policy.max_attempts",
            None,
        ),
        (lambda: lg.skip(rid, "", OPERATOR, "why"), "item_id", None),
        (lambda: lg.runs(state="sleeping"), "state", "queued"),
        (lambda: lg.items(rid, state="done"), "state", "pending"),
        (lambda: lg.reconcile(now="now"), "now", None),  # type: ignore[arg-type]
    ]
    for fn, name, allowed in cases:
        e = nothing_written(lg, fn, InvalidInput)
        assert name in e.message, (name, e.message)
        if allowed is not None:
            assert allowed in e.message, (name, e.message)
    assert lg.status(rid).state == S.RUNNING
    assert lg.accept(le).state == S.ACCEPTED
