"""A stateful test against a reference model written from the rule book (tests/support/spec_model.py):
random commands by every role drive the real ledger and the model; after
every step the runs' states, failure kinds and reasons, `waiting_on`, the items' states
and attempts agree, and `lg.verify()` finds nothing wrong.

Beyond tests/commands/test_stateful.py it makes the moves the audit found broken: review
rejection with live leases, amendments of policy by each role (weakening ones too),
decisions by the party under review, `reconcile(now=...)` ahead of the clock, repeated
retries, repairs and compensations, evidence rules, cancel reasons and failure reasons.

`SpecMachine.bugs` names the audit's bugs whose moves a variant makes. The variant with
none makes only moves today's code already gets right and must pass; each other variant
adds one bug's moves and is a strict xfail while that bug is open. Examples are
derandomized so that an xfail is stable.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ledger import (
    Actor,
    AlreadyTerminal,
    Conflict,
    IllegalTransition,
    InvalidInput,
    Lease,
    LeaseLost,
    Ledger,
    LedgerError,
    NotAuthorized,
    NotComplete,
    StaleReview,
)
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.spec_model import (
    EDITABLE,
    LIVE_RUN,
    OPEN_ITEM,
    MItem,
    MRun,
    after,
    claimable,
    weakens,
)

pytestmark = pytest.mark.timeout(600)

SUBMITTER = Actor("sam", S.SUBMITTER)
CONTROLLER = Actor("ctl", S.CONTROLLER)
REVIEWER = Actor("rita", S.REVIEWER)
OPERATOR = Actor("olga", S.OPERATOR)
RECONCILER = Actor("rec", S.RECONCILER)
WORKERS = (Actor("w1", S.WORKER), Actor("w2", S.WORKER))
BY_ROLE = {
    S.SUBMITTER: SUBMITTER,
    S.CONTROLLER: CONTROLLER,
    S.REVIEWER: REVIEWER,
    S.OPERATOR: OPERATOR,
    S.RECONCILER: RECONCILER,
    S.WORKER: WORKERS[0],
}
LEASE_SECONDS = 30.5  # never equal to a whole number of seconds on the clock
DEADLINE = 100.5
QA = {"decision": "qa", "survives_amendment": False}
QA_SURVIVES = {"decision": "qa", "survives_amendment": True}

POLICY = st.fixed_dictionaries(
    {
        "max_attempts": st.integers(1, 3),
        "backoff_seconds": st.sampled_from([0, 0, 5]),
        "partial_delivery": st.booleans(),
        "tolerated_failures": st.sampled_from([0, 1, "50%"]),
        "review": st.sampled_from([None, None, QA, QA_SURVIVES]),
        "run_deadline_seconds": st.sampled_from([None, None, DEADLINE]),
    }
)
PICK = st.integers(0, 10_000)
WHO = st.integers(0, 9)  # 9 picks a role that may never make the command


TALLY: dict[str, int] = {}  # moves made, by outcome (print with SPEC_TALLY=1)


def pick_actor(roles: set[str], who: int) -> Actor:
    if who == 9:
        wrong = sorted(set(S.ROLES) - roles)
        if wrong:
            return BY_ROLE[wrong[0]]
    ok = sorted(roles)
    return BY_ROLE[ok[who % len(ok)]]


def same(got: Any, want: Any) -> bool:
    """Equal, where a dict the ledger returns may carry more keys than the one asked for."""
    if isinstance(want, dict) and isinstance(got, dict):
        return all(got.get(k) == v for k, v in want.items())
    return bool(got == want)


def state_error(state: str, sources: tuple[str, ...]) -> type[LedgerError] | None:
    if state in sources:
        return None
    return AlreadyTerminal if S.is_terminal(state) else IllegalTransition


class SpecMachine(RuleBasedStateMachine):
    """One fresh ledger (made by `opener`) and the the rule book model, side by side."""

    opener: ClassVar[Callable[[], tuple[str, Callable[[], None]]]]
    bugs: ClassVar[frozenset[int]] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        dsn, self._cleanup = type(self).opener()
        self.lg = Ledger.open(dsn, clock=self.clock)
        self.runs: dict[str, MRun] = {}
        self.order: list[str] = []
        self.leases: list[Lease] = []
        self.fresh = 0
        self.target: str | None = None

    def teardown(self) -> None:
        try:
            report = self.lg.verify()
            assert report.ok, report.problems
        finally:
            self.lg.close()
            self._cleanup()

    # -- helpers --------------------------------------------------------------
    def allow(self, n: int) -> bool:
        """Does this variant make issue-13 bug n's moves?"""
        return n in self.bugs

    def now(self) -> datetime:
        return self.clock()

    def pick(self, pick: int, *prefer: str) -> MRun:
        if self.target is not None:  # a composite step works on one run
            return self.runs[self.target]
        ids = self.order
        if prefer and pick % 4:
            ids = [r for r in self.order if self.runs[r].state in prefer] or self.order
        return self.runs[ids[pick % len(ids)]]

    def call(self, predicted: Any, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run the command. `predicted`: None (success), an error class, or a tuple of them
        (the rule book allows either). A refusal writes nothing."""
        caller = sys._getframe(1).f_code.co_name
        name = getattr(predicted, "__name__", None) or ("ok" if predicted is None else "either")
        event(f"{caller}: {name}")
        TALLY[f"{caller}: {name}"] = TALLY.get(f"{caller}: {name}", 0) + 1
        before = event_count(self.lg)
        try:
            result = fn()
        except LedgerError as e:
            assert predicted is not None, (
                f"refused ({type(e).__name__}: {e}); the rule book accepts"
            )
            assert isinstance(e, predicted), (
                f"raised {type(e).__name__} ({e}); the rule book says {predicted}"
            )
            assert event_count(self.lg) == before, f"the refusal {e!r} wrote events"
            return False, e
        assert predicted is None, f"accepted; the rule book says {predicted}"
        return True, result

    def adopt(self, status: Any, parent: MRun | None = None) -> MRun:
        """A new queued run, its items as the ledger listed them (all pending)."""
        assert status.state == S.QUEUED
        items = {}
        for it in self.lg.items(status.run_id):
            assert (it.state, it.attempts) == (S.PENDING, 0)
            items[it.item_id] = MItem(it.item_id, it.required)
        assert items, (
            f"run {status.run_id} has no items (the rule book: a manifest has at least one)"
        )
        run = MRun(
            status.run_id,
            dict(status.policy),
            items,
            status.input_version,
            submitter_id=status.created_by or SUBMITTER.id,
            versions=[status.input_version],
        )
        self.runs[run.run_id] = run
        self.order.append(run.run_id)
        return run

    # -- submit and start -------------------------------------------------------
    @initialize(
        n=st.integers(1, 4), required=st.lists(st.booleans(), min_size=4, max_size=4), policy=POLICY
    )
    def first_run(self, n: int, required: list[bool], policy: dict[str, Any]) -> None:
        self.submit(n, required, policy, 0, False)
        self.start(0, 0)
        if self.bugs:
            self.bug_moves(0, 0, True)

    @precondition(lambda self: len(self.order) < 3)
    @rule(
        n=st.integers(1, 4),
        required=st.lists(st.booleans(), min_size=4, max_size=4),
        policy=POLICY,
        who=WHO,
        evidence=st.booleans(),
    )
    def submit(
        self, n: int, required: list[bool], policy: dict[str, Any], who: int, evidence: bool
    ) -> None:
        policy = {**policy, "lease_seconds": LEASE_SECONDS}
        if not policy["partial_delivery"]:
            policy["tolerated_failures"] = None
        if evidence and self.allow(5):
            policy["acceptance"] = {"evidence": ["stored_as"]}
        manifest = {
            "source_version": "src-1",
            "config_version": "cfg-1",
            "scope": "spec model",
            "items": [
                {"item_id": f"i{k}", "required": required[k], "payload": {"amount": 10 * k}}
                for k in range(n)
            ],
            "policy": policy,
        }
        actor = pick_actor({S.SUBMITTER}, who)
        ok, status = self.call(
            None if actor.role == S.SUBMITTER else NotAuthorized,
            lambda: self.lg.submit(manifest, actor),
        )
        if ok:
            run = self.adopt(status)
            assert sorted(run.items) == [f"i{k}" for k in range(n)]
            for key in ("max_attempts", "partial_delivery", "tolerated_failures", "review"):
                assert same(run.policy.get(key), policy[key]), (key, run.policy)

    @precondition(lambda self: any(r.state == S.QUEUED for r in self.runs.values()))
    @rule(pick=PICK, who=WHO)
    def start(self, pick: int, who: int) -> None:
        run = self.pick(pick, S.QUEUED)
        actor = pick_actor({S.CONTROLLER}, who)
        err = NotAuthorized if actor.role != S.CONTROLLER else state_error(run.state, (S.QUEUED,))
        ok, _ = self.call(err, lambda: self.lg.start(run.run_id, actor))
        if ok:
            run.go(S.RUNNING)
            run.started_at = self.now()

    # -- workers ---------------------------------------------------------------
    @precondition(lambda self: self.order)
    @rule(pick=PICK, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), who=WHO)
    def claim(self, pick: int, worker: Actor, limit: int, who: int) -> None:
        run = self.pick(pick, S.RUNNING)
        actor = pick_actor({S.WORKER}, who) if who == 9 else worker
        now = self.now()
        ready, unsure = claimable(run, now)
        if actor.role != S.WORKER:
            err: Any = NotAuthorized
        elif run.state != S.RUNNING:
            err = IllegalTransition  # AlreadyTerminal on a terminal run is one too
        else:
            err = None
            if unsure:
                return  # the rule book leaves which items are claimable open right now
        ok, got = self.call(err, lambda: self.lg.claim(run.run_id, actor, limit=limit))
        if not ok:
            if isinstance(got, IllegalTransition):
                assert got.state == run.state, got
            return
        assert len(got) == min(limit, len(ready)), (got, [it.item_id for it in ready])
        ids = {it.item_id for it in ready}
        for le in got:
            assert le.item_id in ids, le.item_id
            it = run.items[le.item_id]
            it.attempts += 1
            it.state, it.token, it.eligible = S.IN_PROGRESS, le.token, None
            it.expires = after(now, run.policy["lease_seconds"])
            assert (le.attempt, le.expires_at, le.worker_id) == (it.attempts, it.expires, actor.id)
            self.leases.append(le)

    def live(self, lease: Lease) -> MItem | None:
        run = self.runs[lease.run_id]
        it = run.items[lease.item_id]
        if (
            not run.terminal
            and it.state == S.IN_PROGRESS
            and it.token == lease.token
            and it.expires is not None
            and it.expires >= self.now()
        ):
            return it
        return None

    @precondition(lambda self: self.leases)
    @rule(pick=PICK)
    def heartbeat(self, pick: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        run = self.runs[lease.run_id]
        it = self.live(lease)
        ok, new = self.call(
            None if it else (LeaseLost, AlreadyTerminal), lambda: self.lg.heartbeat(lease)
        )
        if ok:
            assert it is not None
            it.expires = after(self.now(), run.policy["lease_seconds"])
            assert new.expires_at == it.expires and new.token == lease.token

    @precondition(lambda self: self.leases)
    @rule(
        pick=PICK,
        kind=st.sampled_from(["accept", "accept", "reject", "fail", "fail_final"]),
        evidence=st.sampled_from([True, True, True, False]),
    )
    def outcome(self, pick: int, kind: str, evidence: bool) -> None:
        lease = self.leases[pick % len(self.leases)]
        run = self.runs[lease.run_id]
        now = self.now()
        it = self.live(lease)
        if (
            it is not None
            and run.state in (S.PAUSING, S.CANCELING)
            and any(other is not it for other in run.expired(now))
        ):
            return  # whether this ends the last live lease is open
        needs = (run.policy.get("acceptance") or {}).get("evidence") or []
        proof = {"stored_as": f"s3://out/{lease.item_id}"} if evidence else None
        err: Any = None if it else (LeaseLost, AlreadyTerminal)
        if err is None and kind == "accept" and needs and not proof:
            err = InvalidInput
        calls = {
            "accept": lambda: self.lg.accept(lease, evidence=proof),
            "reject": lambda: self.lg.reject(lease, "rule-1", detail="bad row"),
            "fail": lambda: self.lg.fail_attempt(lease, "flaky upstream"),
            "fail_final": lambda: self.lg.fail_attempt(lease, "broken input", retryable=False),
        }
        ok, status = self.call(err, calls[kind])
        if not ok:
            if kind == "accept" and err is InvalidInput:
                assert "stored_as" in str(status)
            return
        assert it is not None
        it.token = it.expires = None
        if kind == "accept":
            it.state = S.ACCEPTED
        elif kind == "reject":
            it.state = S.REJECTED
        else:
            run.failures += 1
            final = kind == "fail_final" or it.attempts >= run.policy["max_attempts"]
            it.state = S.QUARANTINED if final else S.RETRYABLE
            if not final:
                at = after(now, run.policy["backoff_seconds"])
                it.eligible = (at, at)
                if run.state == S.CANCELING:
                    it.alts = frozenset({S.SKIPPED})  # skipped now or when the cancel ends
        assert status.state == it.state or status.state in it.alts
        run.finish_if_drained()

    @precondition(lambda self: any(r.state == S.RUNNING for r in self.runs.values()))
    @rule(
        pick=PICK,
        worker=st.sampled_from(WORKERS),
        kinds=st.lists(
            st.sampled_from(["accept", "accept", "accept", "reject", "fail_final"]),
            min_size=3,
            max_size=3,
        ),
    )
    def work(self, pick: int, worker: Actor, kinds: list[str]) -> None:
        """A worker's pass: claim and report at once."""
        before = len(self.leases)
        self.claim(pick, worker, len(kinds), 0)
        for k, kind in zip(range(before, len(self.leases)), kinds, strict=False):
            self.outcome(k, kind, True)

    @precondition(lambda self: any(r.state == S.RUNNING for r in self.runs.values()))
    @rule(
        pick=PICK,
        worker=st.sampled_from(WORKERS),
        kinds=st.lists(
            st.sampled_from(["accept", "accept", "accept", "accept", "reject", "fail_final"]),
            min_size=4,
            max_size=4,
        ),
        review=st.booleans(),
    )
    def push_to_the_end(self, pick: int, worker: Actor, kinds: list[str], review: bool) -> None:
        """The happy path in one step: work a running run's items, have it reviewed when its
        policy asks, and complete it (each command checked against the model as usual)."""
        run = self.pick(pick, S.RUNNING)
        if run.state != S.RUNNING:
            return
        self.target = run.run_id
        try:
            self.work(0, worker, kinds)
            if run.state == S.RUNNING and run.review_policy() and review:
                self.request_review(0, 0)
                self.decide(0, True, 0, False)
            if run.state == S.RUNNING:
                self.do_complete(0, 0, True, None)
        finally:
            self.target = None

    @precondition(lambda self: any(r.state == S.RUNNING for r in self.runs.values()))
    @rule(pick=PICK, worker=st.sampled_from(WORKERS), approve=st.booleans(), who=WHO)
    def review_with_live_lease(self, pick: int, worker: Actor, approve: bool, who: int) -> None:
        """A review decided while a worker holds a lease (rejection must fence it)."""
        run = self.pick(pick, S.RUNNING)
        if run.state != S.RUNNING:
            return
        self.target = run.run_id
        try:
            self.claim(0, worker, 1, 0)
            self.request_review(0, 0)
            if run.state == S.AWAITING_REVIEW:
                self.decide(0, approve, who % 6, False)
        finally:
            self.target = None

    # -- review ----------------------------------------------------------------
    @precondition(lambda self: any(r.state == S.RUNNING for r in self.runs.values()))
    @rule(pick=PICK, who=WHO)
    def request_review(self, pick: int, who: int) -> None:
        run = self.pick(pick, S.RUNNING)
        actor = pick_actor({S.CONTROLLER}, who)
        review = run.review_policy()
        decision = review["decision"] if review else "qa"
        err = NotAuthorized if actor.role != S.CONTROLLER else state_error(run.state, (S.RUNNING,))
        ok, status = self.call(err, lambda: self.lg.request_review(run.run_id, actor, decision))
        if ok:
            run.go(S.AWAITING_REVIEW)
            run.bound = run.input_version
            assert status.input_version == run.input_version

    @precondition(lambda self: any(r.state == S.AWAITING_REVIEW for r in self.runs.values()))
    @rule(pick=PICK, approve=st.booleans(), who=st.integers(0, 5), stale=st.booleans())
    def decide(self, pick: int, approve: bool, who: int, stale: bool) -> None:
        run = self.pick(pick, S.AWAITING_REVIEW)
        now = self.now()
        if run.murky(now) and not approve:
            return
        if not approve and run.in_progress() and not self.allow(1):
            return  # bug 1: a rejection does not fence live leases
        actor = REVIEWER
        if who == 5:
            actor = BY_ROLE[S.CONTROLLER]
        elif (
            who == 4 and self.allow(2) and run.state == S.AWAITING_REVIEW
        ):  # four eyes: the submitter or an amender
            ids = sorted({run.submitter_id, *run.amenders})
            actor = Actor(ids[pick % len(ids)], S.REVIEWER)
        version = run.bound or run.input_version
        if stale and len(run.versions) > 1:
            version = run.versions[-2]
        if actor.role != S.REVIEWER:
            err: Any = NotAuthorized
        elif run.state != S.AWAITING_REVIEW:
            err = state_error(run.state, (S.AWAITING_REVIEW,))
        elif actor.id in {run.submitter_id, *run.amenders}:
            err = NotAuthorized
        elif version != run.bound:
            err = StaleReview
        else:
            err = None
        ok, _ = self.call(
            err, lambda: self.lg.decide(run.run_id, actor, version, approve, "looked at it")
        )
        if not ok:
            return
        if approve:
            run.go(S.RUNNING)
            run.approved = True
            review = run.review_policy()
            run.survives_at_approval = bool(review and review.get("survives_amendment"))
        else:
            run.fence()
            run.go(S.FAILED)
            run.failure_kind, run.failure_reason = S.PERMANENT, "review_rejected"

    # -- amend -----------------------------------------------------------------
    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        item=PICK,
        who=st.sampled_from([S.SUBMITTER, S.OPERATOR] * 4 + [S.REVIEWER, S.WORKER, S.CONTROLLER]),
        kind=st.sampled_from(
            ["add", "withdraw", "replace", "strengthen", "weaken", "weaken", "weaken"]
        ),
        which=st.integers(0, 4),
        no_reason=st.booleans(),
    )
    def amend(self, pick: int, item: int, who: str, kind: str, which: int, no_reason: bool) -> None:
        run = self.pick(pick, *LIVE_RUN)
        if run.state == S.CANCELING:
            return  # the rule book does not say whether a canceling run may be amended
        actor = BY_ROLE[who]
        ids = sorted(run.items)
        assert ids, f"run {run.run_id} has no items (the rule book: a manifest has at least one)"
        target = run.items[ids[item % len(ids)]]
        kwargs: dict[str, Any] = {}
        change: dict[str, Any] = {}
        pays = False  # replaces or adds a payload
        if kind == "add":
            self.fresh += 1
            kwargs["items"] = [
                {"item_id": f"n{self.fresh}", "required": item % 2 == 0, "payload": {"n": 1}}
            ]
            pays = True
        elif kind == "withdraw":
            kwargs["withdraw"] = [target.item_id]
        elif kind == "replace":
            pending = [it for it in run.items.values() if it.state == S.PENDING]
            if not pending:
                return
            target = pending[item % len(pending)]
            self.fresh += 1  # a payload it never had, so the content changes
            replaced = {"amount": 10**6 + self.fresh}
            kwargs["items"] = [
                {"item_id": target.item_id, "required": target.required, "payload": replaced}
            ]
            pays = True
        else:
            change = self.policy_change(run, kind, which)
            if not change:
                return
            kwargs["policy"] = change
        weak = bool(change) and weakens(run, change)
        if weak and run.terminal and actor.role in (S.SUBMITTER, S.OPERATOR):
            return  # governance or state first: the rule book's order does not say
        if weak and actor.role == S.SUBMITTER and not self.allow(2):
            return  # bug 2: the submitter may weaken acceptance
        if (
            run.approved
            and run.survives_at_approval
            and pays
            and not self.allow(2)
            and run.review_policy()
        ):
            return  # bug 2: the approval survives a replaced or added payload
        if (
            run.approved
            and not run.survives_at_approval
            and change.get("review", {}) == QA_SURVIVES
            and not self.allow(2)
        ):
            return  # bug 2: survives_amendment set after the approval saves it
        reason: str | None = "amended"
        if weak and actor.role == S.OPERATOR and no_reason:
            if not self.allow(2):
                return  # bug 2: an operator may weaken without a reason
            reason = None
        err: Any = None
        if actor.role not in (S.SUBMITTER, S.OPERATOR):
            err = NotAuthorized  # a role that may never amend, whatever the amendment
        elif run.terminal:
            err = AlreadyTerminal
        elif weak and actor.role == S.SUBMITTER:
            err = NotAuthorized
        elif weak and reason is None:
            err = InvalidInput
        elif kind == "withdraw" and (target.state not in EDITABLE or target.withdrawn):
            err = IllegalTransition
        ok, status = self.call(err, lambda: self.lg.amend(run.run_id, actor, reason, **kwargs))
        if not ok:
            return
        if kind == "add":
            new_id = kwargs["items"][0]["item_id"]
            run.items[new_id] = MItem(new_id, kwargs["items"][0]["required"])
        elif kind == "withdraw":
            target.state, target.withdrawn, target.alts = S.SKIPPED, True, frozenset()
        run.policy.update(change)
        for key, value in change.items():
            assert same(status.policy.get(key), value), (key, status.policy)
        if kind != "strengthen" and kind != "weaken":
            assert status.input_version != run.input_version, "the content changed"
        run.input_version = status.input_version
        run.versions.append(status.input_version)
        run.amenders.add(actor.id)
        if run.state == S.AWAITING_REVIEW:
            run.bound = run.input_version  # rule 7: still awaiting review, of the new version
        if run.approved and not (run.survives_at_approval and not pays):
            run.approved = False
        assert status.state == run.state

    @staticmethod
    def policy_change(run: MRun, kind: str, which: int) -> dict[str, Any]:
        p = run.policy
        options: list[dict[str, Any]] = []
        if kind == "strengthen":
            tol = p.get("tolerated_failures")
            if p.get("partial_delivery") and isinstance(tol, int) and tol > 0:
                options.append({"tolerated_failures": tol - 1})
            if not run.failures:
                options.append({"max_attempts": p["max_attempts"] + 1})
        else:
            review = run.review_policy()
            if review:
                options.append({"review": None})
                if not review.get("survives_amendment"):
                    options.append({"review": QA_SURVIVES})
            if not p.get("partial_delivery"):
                options.append({"partial_delivery": True, "tolerated_failures": 1})
            elif isinstance(p.get("tolerated_failures"), int):
                options.append({"tolerated_failures": p["tolerated_failures"] + 1})
            if run.failures:
                options.append({"max_attempts": p["max_attempts"] + 2})
        return options[which % len(options)] if options else {}

    # -- governance beyond amend's policy: rule 13 and seed 000 ------------------
    def weakenings_of(self, run_id: str) -> int:
        return sum(t.command == "weaken_acceptance" for t in self.lg.history(run_id))

    def governed(self, weak: bool, actor: Actor, reason: str | None) -> Any:
        """Rule 13: a weakening is the operator's, with a reason; the submitter never."""
        if actor.role not in (S.SUBMITTER, S.OPERATOR):
            return NotAuthorized
        if weak and actor.role == S.SUBMITTER:
            return NotAuthorized
        if weak and reason is None:
            return InvalidInput
        return None

    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        item=PICK,
        who=st.sampled_from([S.SUBMITTER, S.OPERATOR, S.OPERATOR, S.WORKER]),
        no_reason=st.booleans(),
    )
    def flip_required(self, pick: int, item: int, who: str, no_reason: bool) -> None:
        """Seed 000: every required item must satisfy the acceptance rule before the run
        succeeds, so turning a required item optional weakens acceptance; the other way
        round strengthens it."""
        run = self.pick(pick, S.RUNNING, S.PAUSED, S.AWAITING_REVIEW)
        if run.terminal or run.state == S.CANCELING:
            return  # terminal: amend's own test; canceling: the rule book is silent
        editable = [it for it in run.items.values() if it.state in EDITABLE and not it.withdrawn]
        if not editable or any(it.alts for it in run.items.values()):
            return
        if run.approved and run.survives_at_approval:
            return  # whether the same payload again "replaces" it the rule book does not say
        target = editable[item % len(editable)]
        actor = BY_ROLE[who]
        weak = target.required  # required -> optional
        reason = None if no_reason else "the customer does not need it"
        err = self.governed(weak, actor, reason)
        before = self.weakenings_of(run.run_id)
        payload = next(i.payload for i in self.lg.items(run.run_id) if i.item_id == target.item_id)
        flipped = {"item_id": target.item_id, "required": not target.required, "payload": payload}
        ok, status = self.call(
            err, lambda: self.lg.amend(run.run_id, actor, reason, items=[flipped])
        )
        if not ok:
            return
        assert self.weakenings_of(run.run_id) == before + weak
        target.required = not target.required
        run.input_version = status.input_version
        run.versions.append(status.input_version)
        run.amenders.add(actor.id)
        if run.state == S.AWAITING_REVIEW:
            run.bound = run.input_version
        run.approved = False  # an amendment voids an approval that does not survive it

    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        who=st.sampled_from([S.SUBMITTER, S.SUBMITTER, S.OPERATOR]),
        new=st.sampled_from([None, 50.5, DEADLINE, 2 * DEADLINE]),
        no_reason=st.booleans(),
    )
    def amend_run_deadline(self, pick: int, who: str, new: float | None, no_reason: bool) -> None:
        """Seed 000: retries only within the accepted deadline policy. Removing or extending
        a run deadline that has already passed weakens acceptance; before it passes, or
        shortening it, is an ordinary amendment."""
        run = self.pick(pick, S.RUNNING, S.PAUSED, S.AWAITING_REVIEW, S.QUEUED)
        if run.terminal or run.state == S.CANCELING:
            return
        old = run.policy.get("run_deadline_seconds")
        if new == old:
            return
        now = self.now()
        passed = old is not None and run.started_at is not None and now > after(run.started_at, old)
        weak = passed and (new is None or new > old)
        actor = BY_ROLE[who]
        reason = None if no_reason else "agreed with the customer"
        err = self.governed(weak, actor, reason)
        before = self.weakenings_of(run.run_id)
        change = {"run_deadline_seconds": new}
        ok, status = self.call(err, lambda: self.lg.amend(run.run_id, actor, reason, policy=change))
        if not ok:
            return
        assert self.weakenings_of(run.run_id) == before + weak
        assert status.policy.get("run_deadline_seconds") == new
        run.policy.update(change)
        run.input_version = status.input_version
        run.versions.append(status.input_version)
        run.amenders.add(actor.id)
        if run.state == S.AWAITING_REVIEW:
            run.bound = run.input_version
        if run.approved and not run.survives_at_approval:
            run.approved = False

    @precondition(lambda self: len(self.order) < 6 and any(r.terminal for r in self.runs.values()))
    @rule(
        pick=PICK,
        who=st.sampled_from([S.SUBMITTER, S.OPERATOR, S.WORKER]),
        kind=st.sampled_from(["strengthen", "weaken", "weaken"]),
        which=st.integers(0, 4),
        no_reason=st.booleans(),
    )
    def repair_under_policy(
        self, pick: int, who: str, kind: str, which: int, no_reason: bool
    ) -> None:
        """Rule 13 and 8: a repair under a corrected policy (a correction_of run) may not
        shed what an amendment may not; an operator's weakening repair, with a reason, is
        recorded on the new run."""
        run = self.pick(pick, *S.TERMINAL_RUN_STATES)
        if not run.terminal or any(it.alts for it in run.items.values()):
            return
        not_accepted = [
            it for it in run.items.values() if not it.withdrawn and it.state != S.ACCEPTED
        ]
        if not not_accepted:
            return  # nothing to repair: the rule book does not name the refusal
        open_child = [c for c in run.children.get("correction_of", []) if not self.runs[c].terminal]
        if open_child:
            return  # rule 15 or rule 13 first: the rule book's order does not say
        change = self.policy_change(run, kind, which)
        if not change:
            return
        weak = weakens(run, change)
        if "max_attempts" in change and change["max_attempts"] > run.policy["max_attempts"]:
            # the rule book: raising max_attempts after an attempt failed or expired (an
            # attempt a fail fenced ended abandoned, neither failed nor expired)
            weak = run.failures > run.abandoned
        actor = BY_ROLE[who]
        reason = None if no_reason else "the gate was retired"
        err = self.governed(weak, actor, reason)
        ok, status = self.call(
            err, lambda: self.lg.repair(run.run_id, actor, policy=change, reason=reason)
        )
        if not ok:
            return
        assert (status.links[0].relation, status.links[0].run_id) == ("correction_of", run.run_id)
        child = self.adopt(status)
        run.children.setdefault("correction_of", []).append(child.run_id)
        assert sorted(child.items) == sorted(it.item_id for it in not_accepted)
        for key, value in change.items():
            assert same(child.policy.get(key), value), (key, child.policy)
        weakening = [t for t in self.lg.history(child.run_id) if t.command == "weaken_acceptance"]
        assert len(weakening) == weak
        if weak:
            assert (weakening[0].actor_id, weakening[0].reason) == (actor.id, reason)
            assert child.run_id in {t.run_id for t in self.lg.audit(role=S.OPERATOR)}

    # -- run lifecycle ---------------------------------------------------------
    @precondition(lambda self: self.order)
    @rule(
        kind=st.sampled_from(["pause", "resume", "cancel", "complete", "fail", "fail"]),
        pick=PICK,
        who=WHO,
        transient=st.booleans(),
        reason=st.sampled_from([None, "input_unavailable"]),
    )
    def lifecycle(
        self, kind: str, pick: int, who: int, transient: bool, reason: str | None
    ) -> None:
        getattr(self, f"do_{kind}")(pick, who, transient, reason)

    def do_pause(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.pick(pick, S.RUNNING)
        if run.murky(self.now()):
            self.reconcile(0, False)  # settle the expired leases first
        actor = pick_actor({S.OPERATOR}, who)
        err = NotAuthorized if actor.role != S.OPERATOR else state_error(run.state, (S.RUNNING,))
        ok, _ = self.call(err, lambda: self.lg.pause(run.run_id, actor, "hold"))
        if ok:
            run.go(S.PAUSING if run.in_progress() else S.PAUSED)

    def do_resume(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.pick(pick, S.PAUSING, S.PAUSED)
        actor = pick_actor({S.OPERATOR}, who)
        err = (
            NotAuthorized
            if actor.role != S.OPERATOR
            else state_error(run.state, (S.PAUSING, S.PAUSED))
        )
        ok, _ = self.call(err, lambda: self.lg.resume(run.run_id, actor, reason="back to work"))
        if ok:
            run.go(S.RUNNING)

    def do_cancel(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.pick(pick, *LIVE_RUN)
        if run.murky(self.now()):
            self.reconcile(0, False)  # settle the expired leases first
        actor = pick_actor({S.SUBMITTER, S.OPERATOR}, who)
        self.fresh += 1
        why = f"stop {self.fresh}"
        already = run.state in (S.CANCELING, S.CANCELED)
        if actor.role not in (S.SUBMITTER, S.OPERATOR):
            err: Any = NotAuthorized
        elif already:
            err = None
        else:
            err = state_error(run.state, LIVE_RUN)
        in_flight = len(run.in_progress())
        ok, out = self.call(err, lambda: self.lg.cancel(run.run_id, actor, why))
        if not ok:
            return
        assert out.already == already
        if already:
            assert out.state == run.state
            return
        assert out.in_flight == in_flight
        run.cancel_reason = why
        if in_flight and run.state != S.QUEUED and run.state != S.PAUSED:
            run.go(S.CANCELING)
            for it in run.items.values():  # skipped now or when the last lease ends
                if it.state in (S.PENDING, S.RETRYABLE):
                    it.alts = frozenset({it.state})
                    it.state = S.SKIPPED
        else:
            run.skip_open()
            run.go(S.CANCELED)
            run.stop_reason = why
        assert out.state == run.state

    def do_complete(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.pick(pick, S.RUNNING)
        actor = pick_actor({S.CONTROLLER}, who)
        done = run.state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS)
        to = run.state
        if actor.role != S.CONTROLLER:
            err: Any = NotAuthorized
        elif done:
            err = None
        else:
            err = state_error(run.state, (S.RUNNING,))
        if err is None and not done:
            if any(it.alts for it in run.items.values()):
                return
            states = [it.state for it in run.items.values()]
            missing = [
                it
                for it in run.items.values()
                if it.required and not it.withdrawn and it.state != S.ACCEPTED
            ]
            if any(s in OPEN_ITEM for s in states) or (run.review_policy() and not run.approved):
                err = NotComplete
            elif not missing:
                to = S.SUCCEEDED
            elif run.policy.get("partial_delivery") and len(missing) <= run.tolerated():
                to = S.COMPLETED_WITH_ERRORS
            else:
                err = NotComplete
        ok, status = self.call(err, lambda: self.lg.complete(run.run_id, actor))
        if ok:
            run.go(to)
            assert status.state == to

    def do_fail(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.pick(pick, *LIVE_RUN)
        if run.murky(self.now()):
            self.reconcile(0, False)  # settle the expired leases first
        actor = pick_actor({S.CONTROLLER, S.OPERATOR}, who)
        if actor.role == S.OPERATOR and who != 7:
            transient = True  # mostly; an operator's permanent failure is refused
        if actor.role == S.CONTROLLER and reason is None and not self.allow(7):
            reason = "input_unavailable"  # bug 7: the controller's default reason is null
        if actor.role not in (S.CONTROLLER, S.OPERATOR) or (
            actor.role == S.OPERATOR and not transient
        ):
            err: Any = NotAuthorized
        else:
            err = state_error(run.state, LIVE_RUN)
        ok, _ = self.call(
            err,
            lambda: self.lg.fail(run.run_id, actor, "gave up", transient, failure_reason=reason),
        )
        if ok:
            run.fence()
            run.go(S.FAILED)
            run.failure_kind = S.TRANSIENT if transient else S.PERMANENT
            run.failure_reason = reason or (
                "operator_decision" if actor.role == S.OPERATOR else "controller_decision"
            )

    # -- item commands by people -------------------------------------------------
    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        item=PICK,
        command=st.sampled_from(["skip", "release", "release", "reject_item"]),
        who=WHO,
    )
    def item_command(self, pick: int, item: int, command: str, who: int) -> None:
        run = self.pick(pick, S.RUNNING, S.PAUSED, S.AWAITING_REVIEW, *S.TERMINAL_RUN_STATES)
        if run.state == S.CANCELING:
            return  # the rule book does not say what a skip or release does to a canceling run
        quarantined = [it for it in run.items.values() if it.state == S.QUARANTINED]
        ids = sorted(run.items)
        it = (
            quarantined[item % len(quarantined)]
            if quarantined and item % 3
            else (run.items[ids[item % len(ids)]])
        )
        if it.alts:
            return
        roles = {
            "skip": {S.OPERATOR, S.REVIEWER},
            "release": {S.REVIEWER, S.OPERATOR},
            "reject_item": {S.REVIEWER},
        }[command]
        sources = {"skip": EDITABLE, "release": {S.QUARANTINED}, "reject_item": {S.QUARANTINED}}[
            command
        ]
        actor = pick_actor(roles, who)
        if actor.role not in roles:
            err: Any = NotAuthorized
        elif run.terminal:
            err = AlreadyTerminal
        elif it.state not in sources:
            err = IllegalTransition
        else:
            err = None
        calls = {
            "skip": lambda: self.lg.skip(run.run_id, it.item_id, actor, "not needed"),
            "release": lambda: self.lg.release(run.run_id, it.item_id, actor, "try again"),
            "reject_item": lambda: self.lg.reject_item(run.run_id, it.item_id, actor, "rule-2"),
        }
        ok, status = self.call(err, calls[command])
        if not ok:
            return
        to = {"skip": S.SKIPPED, "release": S.RETRYABLE, "reject_item": S.REJECTED}[command]
        it.state = to
        if to == S.RETRYABLE:
            now = self.now()
            it.eligible = (now, after(now, run.policy["backoff_seconds"]))
        assert status.state == to

    # -- linked runs -------------------------------------------------------------
    @precondition(lambda self: len(self.order) < 6 and any(r.terminal for r in self.runs.values()))
    @rule(
        pick=PICK,
        who=st.sampled_from([S.SUBMITTER, S.OPERATOR, S.OPERATOR, S.WORKER]),
        command=st.sampled_from(["retry", "retry", "repair", "compensate"]),
    )
    def linked(self, pick: int, who: str, command: str, again: bool = False) -> None:
        run = self.pick(pick, *S.TERMINAL_RUN_STATES)
        actor = BY_ROLE[who]
        roles = {S.OPERATOR} if command == "compensate" else {S.SUBMITTER, S.OPERATOR}
        relation = {"retry": "retry_of", "repair": "repair_of", "compensate": "compensates"}[
            command
        ]
        open_child = [c for c in run.children.get(relation, []) if not self.runs[c].terminal]
        in_manifest = [it for it in run.items.values() if not it.withdrawn]
        not_accepted = [it for it in in_manifest if it.state != S.ACCEPTED]
        accepted = [it for it in in_manifest if it.state == S.ACCEPTED]
        if command == "repair" and not not_accepted:
            return  # nothing to repair: the rule book does not name the refusal
        if command == "compensate" and not accepted:
            return
        if any(it.alts for it in run.items.values()):
            return
        if actor.role not in roles:
            err: Any = NotAuthorized
        elif not run.terminal or (
            command == "retry" and (run.state, run.failure_kind) != (S.FAILED, S.TRANSIENT)
        ):
            err = IllegalTransition
        elif open_child:
            if not self.allow(4):
                return  # bug 4: a second linked run of the same relation is accepted
            err = Conflict
        else:
            err = None
        calls = {
            "retry": lambda: self.lg.retry(run.run_id, actor),
            "repair": lambda: self.lg.repair(run.run_id, actor),
            "compensate": lambda: self.lg.compensate(run.run_id, actor, "undo it"),
        }
        ok, status = self.call(err, calls[command])
        if not ok:
            if err is Conflict:
                assert any(c in str(status) for c in open_child), status
            return
        assert (status.links[0].relation, status.links[0].run_id) == (relation, run.run_id)
        child = self.adopt(status)
        run.children.setdefault(relation, []).append(child.run_id)
        if command == "retry":
            assert sorted(child.items) == sorted(it.item_id for it in in_manifest)
            for key in ("max_attempts", "partial_delivery", "tolerated_failures", "review"):
                assert same(child.policy.get(key), run.policy.get(key)), key
        elif command == "repair":
            assert sorted(child.items) == sorted(it.item_id for it in not_accepted)
        if self.allow(4) and not again:  # the same command again while the first is open
            self.target = run.run_id
            try:
                self.linked(0, who, command, again=True)
            finally:
                self.target = None

    @precondition(lambda self: bool(self.bugs) and bool(self.order))
    @rule(pick=PICK, which=st.integers(0, 4), flag=st.booleans())
    def bug_moves(self, pick: int, which: int, flag: bool) -> None:
        """A variant's own moves on one run, more often than the rules above draw them
        (and once at the start of every example, so an open bug is found whatever path
        the rest of the example takes)."""
        run = self.pick(pick, S.RUNNING)
        for n in sorted(self.bugs):
            self.target = run.run_id
            try:
                if n == 1:
                    self.review_with_live_lease(0, WORKERS[0], False, 0)
                elif n == 2:
                    self.amend(0, pick, S.SUBMITTER if flag else S.OPERATOR, "weaken", which, True)
                    if run.state == S.RUNNING:
                        self.request_review(0, 0)
                    if run.state == S.AWAITING_REVIEW:
                        self.decide(0, flag, 4, False)  # by the submitter or an amender
                elif n == 3:
                    self.reconcile(0, True)
                elif n == 4:
                    if run.state in LIVE_RUN:
                        self.do_fail(0, 0, True, "input_unavailable")
                    self.linked(0, S.OPERATOR, "retry" if flag else "repair")
                elif n == 5 and len(self.order) < 4:
                    self.target = None
                    policy = {"max_attempts": 2, "backoff_seconds": 0, "partial_delivery": False}
                    policy.update(tolerated_failures=0, review=None, run_deadline_seconds=None)
                    self.submit(2, [True] * 4, policy, 0, True)
                elif n == 6:
                    self.do_cancel(0, 0, True, None)
                elif n == 7:
                    self.do_fail(0, 0, flag, None)
            finally:
                self.target = None

    # -- the reconciler and the clock --------------------------------------------
    @rule(who=st.integers(0, 9), future=st.sampled_from([False, False, False, True]))
    def reconcile(self, who: int, future: bool) -> None:
        actor = pick_actor({S.RECONCILER, S.OPERATOR}, who)
        if actor.role not in (S.RECONCILER, S.OPERATOR):
            self.call(NotAuthorized, lambda: self.lg.reconcile(actor=actor))
            return
        now = self.now()
        if future:
            if not self.allow(3):
                return  # bug 3: a `now` ahead of the store's clock is trusted
            self.call(
                InvalidInput,
                lambda: self.lg.reconcile(now=now + timedelta(days=365), actor=actor),
            )
            return
        expired = cancels = failed = 0
        for run in self.runs.values():
            if run.terminal:
                continue  # nothing of a terminal run changes (rule 12)
            for it in run.expired(now):
                expired += 1
                run.failures += 1
                exhausted = it.attempts >= run.policy["max_attempts"]
                assert it.expires is not None
                lo = after(it.expires, run.policy["backoff_seconds"])
                hi = after(now, run.policy["backoff_seconds"])
                it.token = it.expires = None
                it.state = S.QUARANTINED if exhausted else S.RETRYABLE
                it.eligible = None if exhausted else (lo, hi)
                if run.state == S.CANCELING and not exhausted:
                    it.alts = frozenset({S.SKIPPED})
            cancels += run.finish_if_drained() == "cancel"
            rd = run.policy.get("run_deadline_seconds")
            if (
                rd is not None
                and run.started_at is not None
                and not run.in_progress()
                and run.state in (S.RUNNING, S.AWAITING_REVIEW, S.PAUSING, S.PAUSED)
                and now > after(run.started_at, rd)
            ):
                run.go(S.FAILED)
                run.failure_kind, run.failure_reason = S.TRANSIENT, "deadline_exceeded"
                failed += 1
        _, report = self.call(None, lambda: self.lg.reconcile(actor=actor))
        assert (report.expired_leases, report.finished_cancels, report.failed_runs) == (
            expired,
            cancels,
            failed,
        )

    @rule(seconds=st.sampled_from([1, 7, 13, 31, 31, 61, 101]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- agreement after every step ----------------------------------------------
    @invariant()
    def ledger_agrees_with_spec(self) -> None:
        now = self.now()
        for run_id in self.order:
            m, s = self.runs[run_id], self.lg.status(run_id)
            assert (s.state, s.failure_kind, s.failure_reason) == (
                m.state,
                m.failure_kind,
                m.failure_reason,
            ), run_id
            assert s.input_version == m.input_version
            want = m.waiting_on(now)
            if want is not None:
                assert s.waiting_on == want, (run_id, s.state, s.counts)
            if m.state == S.CANCELED and m.stop_reason and self.allow(7):
                assert s.stop_reason == m.stop_reason
            items = {i.item_id: i for i in self.lg.items(run_id)}
            assert set(items) == set(m.items), run_id
            tally: dict[str, int] = {}
            for item_id, mi in m.items.items():
                got = items[item_id]
                assert mi.may_be(got.state), (run_id, item_id, got.state, mi.state, mi.alts)
                assert got.attempts == mi.attempts, (run_id, item_id)
                if mi.alts:  # the ledger has chosen one of the rule book's readings
                    mi.state, mi.alts = got.state, frozenset()
                tally[got.state] = tally.get(got.state, 0) + 1
            assert {k: v for k, v in s.counts.items() if v} == tally
            if m.state == S.CANCELED and self.allow(6):
                history = self.lg.history(run_id)
                assert history[-1].item_id is None and history[-1].to_state == S.CANCELED, (
                    "an item changed after its run was canceled"
                )
        report = self.lg.verify()
        assert report.ok, report.problems


# ---------------------------------------------------------------------------
# the variants
# ---------------------------------------------------------------------------
SETTINGS = settings(
    max_examples=50,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

# an open bug's variant fails at once: no shrinking (the message shows the steps anyway)
FIND_ONLY = settings(SETTINGS, phases=[Phase.explicit, Phase.generate])


def memory() -> tuple[str, Callable[[], None]]:
    return "memory://", lambda: None


def sqlite() -> tuple[str, Callable[[], None]]:
    folder = tempfile.mkdtemp(prefix="ledger-spec-")
    return f"sqlite:///{folder}/ledger.db", lambda: shutil.rmtree(folder, ignore_errors=True)


def machine(
    opener: Callable[[], tuple[str, Callable[[], None]]], bugs: frozenset[int] = frozenset()
) -> type[SpecMachine]:
    return type("SpecMachine", (SpecMachine,), {"opener": staticmethod(opener), "bugs": bugs})


def test_spec_model_memory() -> None:
    """The moves today's code already gets right."""
    TALLY.clear()
    run_state_machine_as_test(machine(memory), settings=SETTINGS)
    if os.environ.get("SPEC_TALLY") == "1":
        print(sorted(TALLY.items()))


def test_spec_model_sqlite() -> None:
    run_state_machine_as_test(machine(sqlite), settings=settings(SETTINGS, max_examples=10))


BUG_VARIANTS = {
    1: "a review rejection leaves live leases the worker and the reconciler still use",
    2: "the party under review weakens acceptance, decides its own review, or keeps an "
    "approval through a changed payload",
    3: "reconcile(now=...) ahead of the store's clock is accepted",
    4: "a second retry, repair or compensate is accepted while the first is open",
    5: "policy.acceptance.evidence is refused by the manifest and never enforced",
    6: "a cancel with no live lease writes the run's canceled event before its items' skips",
    7: "a controller's fail stores failure_reason null; the cancel reason is not the stop reason",
}


@pytest.mark.parametrize("n", [pytest.param(n, id=f"bug{n}") for n in BUG_VARIANTS])
def test_spec_model_with_bug_moves(n: int) -> None:
    # 10 examples each: every example makes its bug's moves at its start (first_run), so
    # an open bug is found in the first; every_move runs all of them together at 50
    run_state_machine_as_test(
        machine(memory, frozenset({n})), settings=settings(FIND_ONLY, max_examples=10)
    )


def test_spec_model_every_move() -> None:
    run_state_machine_as_test(machine(memory, frozenset(BUG_VARIANTS)), settings=FIND_ONLY)
