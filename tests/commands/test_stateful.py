"""A stateful property test: random commands from several actors drive the real ledger and
a small reference model side by side; after every step their states, counts and
errors must agree.

The machine issues every command of API.md (submit, start, amend, claim, heartbeat,
accept, reject, fail_attempt, skip, release, reject_item, request_review, decide, pause,
resume, cancel, complete, fail, retry, repair, compensate, reconcile), from the right
role most of the time and from a wrong one sometimes, with current and stale expected
revisions, with live, expired and superseded leases, and moves the injected clock
(lease expiries, backoffs, item and run deadlines). The model is written from the rule book's
tables and rules, in its order of checks; it predicts the error type exactly (an
`AlreadyTerminal` is not an `IllegalTransition`).

Hypothesis settings profiles (`HYPOTHESIS_PROFILE` selects one; "ci" is the default):

- ``ci``: 500 examples on memory, 100 on SQLite, 20 on PostgreSQL, 15 steps each
  (about a minute in all);
- ``deep``: four times the examples and 50 steps each, for a long local run (tens of
  minutes; the per-test timeout is raised to match):
  ``HYPOTHESIS_PROFILE=deep pytest tests/commands/test_stateful.py``.

The profiles are applied to this module's machines only; other modules keep theirs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import ledger.core.errors as E
from ledger import Actor, Lease, Ledger
from ledger.core.states import ROLES, TERMINAL_RUN_STATES
from tests.support.clock import ManualClock

settings.register_profile(
    "ci",
    max_examples=350,
    stateful_step_count=25,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


def profile_name() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return name if name in ("ci", "deep") else "ci"


# the deep profile runs far longer than the suite's per-test timeout
pytestmark = pytest.mark.timeout(300 if profile_name() == "ci" else 4 * 3600)


def profile() -> settings:
    """Ours, by HYPOTHESIS_PROFILE; "ci" for any name this module does not define."""
    return settings.get_profile(profile_name())


# every actor the machine uses, by role; two workers compete for items
BY_ROLE = {role: Actor(f"{role}-1", role) for role in ROLES}
WORKERS = (Actor("w1", "worker"), Actor("w2", "worker"))
OPEN = ("pending", "in_progress", "retryable")
EDITABLE = ("pending", "retryable", "quarantined")
ITEM_STATES = (
    "pending",
    "in_progress",
    "retryable",
    "quarantined",
    "accepted",
    "rejected",
    "skipped",
)


def pick_actor(allowed: set[str], who: int) -> Actor:
    """Mostly an allowed role; `who` of 10 or 11 picks a role that may not make the command."""
    if who >= 10:
        wrong = sorted(set(ROLES) - allowed)
        if wrong:
            return BY_ROLE[wrong[who % len(wrong)]]
    ok = sorted(allowed)
    return BY_ROLE[ok[who % len(ok)]]


# --------------------------------------------------------------------------
# the reference model
# --------------------------------------------------------------------------
@dataclass
class MItem:
    item_id: str
    required: bool
    state: str = "pending"
    attempts: int = 0
    revision: int = 0  # the item's stream begins (version 1) with its first transition
    token: str | None = None
    worker: str | None = None
    expires: datetime | None = None
    eligible: datetime | None = None
    in_manifest: bool = True
    outcomes: list[str | None] = field(default_factory=list)

    def move(self, to: str) -> None:
        self.revision += 1  # one event per transition, the first included
        self.state = to

    def end_attempt(self, outcome: str, to: str, eligible: datetime | None = None) -> None:
        self.outcomes[-1] = outcome
        self.token = self.worker = self.expires = None
        if to == "retryable":
            self.eligible = eligible
        self.move(to)


@dataclass
class MRun:
    run_id: str
    policy: dict[str, Any]
    items: dict[str, MItem]
    input_version: str
    state: str = "queued"
    revision: int = 1
    started_at: datetime | None = None
    failure_kind: str | None = None
    failure_reason: str | None = None
    review: dict[str, Any] | None = None  # decision, bound (input version), approved
    linked: dict[str, str] = field(default_factory=dict)  # command -> latest linked run

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(ITEM_STATES, 0)
        for it in self.items.values():
            out[it.state] += 1
        return out

    def go(self, to: str) -> None:
        self.state = to
        self.revision += 1

    def past_item_deadline(self, now: datetime) -> bool:
        d = self.policy["item_deadline_seconds"]
        return (
            d is not None
            and self.started_at is not None
            and now > self.started_at + timedelta(seconds=d)
        )

    def waiting_on(self, now: datetime) -> str:
        owner = self._owner()
        expired = any(
            it.state == "in_progress" and it.expires is not None and it.expires < now
            for it in self.items.values()
        )
        # rule 19: the workers' turn, but a lease expired and nobody reconciled it
        return "reconciler" if owner == "workers" and expired else owner

    def _owner(self) -> str:
        c = self.counts()
        if self.state in TERMINAL_RUN_STATES:
            return "nobody"
        if self.state == "queued":
            return "controller"
        if self.state == "awaiting_review":
            return "reviewer"
        if self.state == "paused":
            return "operator"
        if self.state in ("canceling", "pausing"):
            return "workers" if c["in_progress"] else "controller"
        if c["pending"] or c["retryable"] or c["in_progress"]:
            return "workers"
        return "reviewer" if c["quarantined"] else "controller"


def state_error(state: str, sources: tuple[str, ...]) -> type[E.LedgerError] | None:
    if state in sources:
        return None
    return E.AlreadyTerminal if state in TERMINAL_RUN_STATES else E.IllegalTransition


# --------------------------------------------------------------------------
# the machine
# --------------------------------------------------------------------------
POLICY = st.fixed_dictionaries(
    {
        "max_attempts": st.integers(1, 3),
        "lease_seconds": st.sampled_from([10, 30]),
        "backoff_seconds": st.sampled_from([0, 5]),
        "partial_delivery": st.booleans(),
        "tolerated_failures": st.sampled_from([None, 0, 1, "50%"]),
        "review": st.sampled_from(
            [
                None,
                None,
                None,
                {"decision": "qa", "survives_amendment": False},
                {"decision": "qa", "survives_amendment": True},
            ]
        ),
        "item_deadline_seconds": st.sampled_from([None, None, 60]),
        "run_deadline_seconds": st.sampled_from([None, None, 100]),
    }
)
PICK = st.integers(0, 1000)
EXACT = 10**6
WHO = st.integers(0, 11)
REV = st.sampled_from([None, None, None, None, None, None, "current", "stale"])


class LedgerMachine(RuleBasedStateMachine):
    """Drives one fresh ledger (made by `opener`) and the model."""

    opener: Callable[[], tuple[str, Callable[[], None]]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        dsn, self._cleanup = type(self).opener()
        self.lg = Ledger.open(dsn, clock=self.clock)
        self.runs: dict[str, MRun] = {}
        self.order: list[str] = []
        self.leases: list[Lease] = []
        self.fresh = 0

    def teardown(self) -> None:
        self.lg.close()
        self._cleanup()

    # -- helpers ----------------------------------------------------------
    def now(self) -> datetime:
        return self.clock()

    def run(self, pick: int, *prefer: str) -> MRun:
        """A run; mostly one in a `prefer`red state when there is one (so steps are not wasted
        on refusals), sometimes any run (so refusals are exercised too)."""
        if pick >= EXACT:  # exactly the run at this position (used by composite steps)
            return self.runs[self.order[pick - EXACT]]
        ids = self.order
        if prefer and pick % 5:
            ids = [r for r in self.order if self.runs[r].state in prefer] or self.order
        return self.runs[ids[pick % len(ids)]]

    def call(
        self, predicted: type[E.LedgerError] | None, fn: Callable[[], Any]
    ) -> tuple[bool, Any]:
        """Run the real command; its error type (or success) must be the predicted one."""
        event(f"{sys._getframe(1).f_code.co_name}: {predicted.__name__ if predicted else 'ok'}")
        try:
            result = fn()
        except E.LedgerError as e:
            assert predicted is not None, (
                f"the ledger refused ({type(e).__name__}: {e}); the model accepts"
            )
            assert type(e) is predicted, (
                f"the ledger raised {type(e).__name__} ({e}); the model predicts "
                f"{predicted.__name__}"
            )
            return False, e
        assert predicted is None, f"the ledger accepted; the model predicts {predicted.__name__}"
        return True, result

    @staticmethod
    def expected(mode: str | None, revision: int) -> int | None:
        return None if mode is None else revision if mode == "current" else max(revision - 1, 0)

    def run_checks(
        self,
        run: MRun,
        actor: Actor,
        roles: set[str],
        expected: int | None,
        sources: tuple[str, ...] | None,
    ) -> type[E.LedgerError] | None:
        if actor.role not in roles:
            return E.NotAuthorized
        if expected is not None and expected != run.revision:
            return E.Conflict
        return state_error(run.state, sources) if sources is not None else None

    def add_run(
        self,
        status: Any,
        items: list[tuple[str, bool]],
        policy: dict[str, Any],
        weakened: bool = False,
    ) -> None:
        # a new run weaker than its original also records its weaken_acceptance transition
        revision = 2 if weakened else 1
        assert status.state == "queued" and status.revision == revision
        self.runs[status.run_id] = MRun(
            status.run_id, dict(policy), {i: MItem(i, r) for i, r in items}, status.input_version
        )
        self.runs[status.run_id].revision = revision
        self.order.append(status.run_id)

    def finish_if_drained(self, run: MRun) -> str | None:
        if run.counts()["in_progress"]:
            return None
        if run.state == "canceling":
            for it in run.items.values():
                if it.state in ("pending", "retryable"):
                    it.move("skipped")
            run.go("canceled")
            return "cancel"
        if run.state == "pausing":
            run.go("paused")
            return "pause"
        return None

    def live(self, lease: Lease) -> MItem | None:
        run = self.runs[lease.run_id]
        it = run.items[lease.item_id]
        if (
            it.state == "in_progress"
            and it.token == lease.token
            and it.worker == lease.worker_id
            and it.expires is not None
            and it.expires >= self.now()
        ):
            return it
        return None

    # -- run commands -------------------------------------------------------
    @initialize(
        n=st.integers(1, 4), required=st.lists(st.booleans(), min_size=4, max_size=4), policy=POLICY
    )
    def a_running_run(self, n: int, required: list[bool], policy: dict[str, Any]) -> None:
        """Every example starts with one running run, so the interesting steps come early."""
        self.submit(n, required, policy, 0)
        self.start(0, 0, None)

    @precondition(lambda self: len(self.order) < 3)
    @rule(
        n=st.integers(1, 4),
        required=st.lists(st.booleans(), min_size=4, max_size=4),
        policy=POLICY,
        who=WHO,
    )
    def submit(self, n: int, required: list[bool], policy: dict[str, Any], who: int) -> None:
        policy = dict(policy)
        if not policy["partial_delivery"]:
            policy["tolerated_failures"] = None
        items = [(f"i{k}", required[k]) for k in range(n)]
        manifest = {
            "source_version": "src",
            "config_version": "cfg",
            "items": [{"item_id": i, "required": r} for i, r in items],
            "policy": policy,
        }
        actor = pick_actor({"submitter"}, who)
        ok, status = self.call(
            None if actor.role == "submitter" else E.NotAuthorized,
            lambda: self.lg.submit(manifest, actor),
        )
        if ok:
            self.add_run(status, items, status.policy)

    @precondition(lambda self: any(r.state == "queued" for r in self.runs.values()))
    @rule(pick=PICK, who=WHO, rev=REV)
    def start(self, pick: int, who: int, rev: str | None) -> None:
        run = self.run(pick, "queued")
        actor = pick_actor({"controller"}, who)
        expected = self.expected(rev, run.revision)
        ok, _ = self.call(
            self.run_checks(run, actor, {"controller"}, expected, ("queued",)),
            lambda: self.lg.start(run.run_id, actor, expected_revision=expected),
        )
        if ok:
            run.go("running")
            run.started_at = self.now()

    def request_review(self, pick: int, who: int, right: bool) -> None:
        run = self.run(pick, "running")
        actor = pick_actor({"controller"}, who)
        review = run.policy["review"]
        decision = (review["decision"] if review else "qa") if right else "other"
        err = self.run_checks(run, actor, {"controller"}, None, ("running",))
        if err is None and review and decision != review["decision"]:
            err = E.InvalidInput
        ok, _ = self.call(err, lambda: self.lg.request_review(run.run_id, actor, decision))
        if ok:
            run.go("awaiting_review")
            approved = (run.review or {}).get("approved")
            run.review = {"decision": decision, "bound": run.input_version, "approved": approved}

    def decide(self, pick: int, who: int, stale: bool, approve: bool) -> None:
        run = self.run(pick, "awaiting_review")
        actor = pick_actor({"reviewer"}, who)
        bound = (run.review or {}).get("bound", run.input_version)
        version = "sha256:not-the-one" if stale else bound
        err = self.run_checks(run, actor, {"reviewer"}, None, ("awaiting_review",))
        if err is None and version != bound:
            err = E.StaleReview
        ok, _ = self.call(
            err, lambda: self.lg.decide(run.run_id, actor, version, approve, "looked")
        )
        if ok:
            if approve:
                run.go("running")
                assert run.review is not None
                run.review["approved"] = version
            else:
                # a rejection fails the run, and a failed run holds no live lease (the rule book: a
                # fail fences live leases; items of a terminal run never change after)
                for it in run.items.values():
                    if it.state == "in_progress":
                        it.end_attempt("abandoned", "retryable", None)
                run.go("failed")
                run.failure_kind, run.failure_reason = "permanent", "review_rejected"

    def pause(self, pick: int, who: int, rev: str | None) -> None:
        run = self.run(pick, "running")
        actor = pick_actor({"operator"}, who)
        expected = self.expected(rev, run.revision)
        ok, _ = self.call(
            self.run_checks(run, actor, {"operator"}, expected, ("running",)),
            lambda: self.lg.pause(run.run_id, actor, "hold", expected_revision=expected),
        )
        if ok:
            run.go("pausing" if run.counts()["in_progress"] else "paused")

    def resume(self, pick: int, who: int, rev: str | None) -> None:
        run = self.run(pick, "pausing", "paused")
        actor = pick_actor({"operator"}, who)
        expected = self.expected(rev, run.revision)
        ok, _ = self.call(
            self.run_checks(run, actor, {"operator"}, expected, ("pausing", "paused")),
            lambda: self.lg.resume(
                run.run_id, actor, expected_revision=expected, reason="back to work"
            ),
        )
        if ok:
            run.go("running")

    def cancel(self, pick: int, who: int) -> None:
        run = self.run(pick, "queued", "running", "paused", "pausing", "awaiting_review")
        actor = pick_actor({"submitter", "operator"}, who)
        in_flight = run.counts()["in_progress"]
        err = self.run_checks(run, actor, {"submitter", "operator"}, None, None)
        already = err is None and run.state in ("canceling", "canceled")
        if err is None and not already:
            err = state_error(
                run.state, ("queued", "paused", "running", "awaiting_review", "pausing")
            )
        ok, out = self.call(err, lambda: self.lg.cancel(run.run_id, actor, "enough"))
        if not ok:
            return
        if not already:
            run.go("canceling" if in_flight else "canceled")
            for it in run.items.values():
                if it.state in ("pending", "retryable"):
                    it.move("skipped")
        assert (out.state, out.in_flight, out.already) == (run.state, in_flight, already)

    def complete(self, pick: int, who: int, rev: str | None) -> None:
        run = self.run(pick, "running")
        actor = pick_actor({"controller"}, who)
        expected = self.expected(rev, run.revision)
        err = self.run_checks(run, actor, {"controller"}, expected, None)
        done = err is None and run.state in ("succeeded", "completed_with_errors")
        to = run.state
        if err is None and not done:
            err = state_error(run.state, ("running",))
        if err is None and not done:
            c = run.counts()
            review = run.policy["review"]
            approved = (run.review or {}).get("approved")
            missing = [
                it
                for it in run.items.values()
                if it.in_manifest and it.required and it.state != "accepted"
            ]
            required = sum(1 for it in run.items.values() if it.in_manifest and it.required)
            tol = run.policy["tolerated_failures"]
            tolerated = (
                required
                if tol is None
                else tol
                if isinstance(tol, int)
                else required * int(tol.rstrip("%")) // 100
            )
            if any(c[s] for s in OPEN) or (
                review
                and not (
                    approved == run.input_version
                    or (approved is not None and review["survives_amendment"])
                )
            ):
                err = E.NotComplete
            elif not missing:
                to = "succeeded"
            elif run.policy["partial_delivery"] and len(missing) <= tolerated:
                to = "completed_with_errors"
            else:
                err = E.NotComplete
        ok, status = self.call(
            err, lambda: self.lg.complete(run.run_id, actor, expected_revision=expected)
        )
        if ok and not done:
            run.go(to)
        if ok:
            assert status.state == to

    def fail(self, pick: int, who: int, transient: bool, reason: str | None) -> None:
        run = self.run(pick, "queued", "running", "paused", "pausing", "awaiting_review")
        actor = pick_actor({"controller", "operator"}, who)
        if actor.role == "operator" and not transient:
            err: type[E.LedgerError] | None = E.NotAuthorized
        else:
            err = self.run_checks(
                run,
                actor,
                {"controller", "operator"},
                None,
                ("queued", "running", "awaiting_review", "pausing", "paused"),
            )
        ok, _ = self.call(
            err,
            lambda: self.lg.fail(run.run_id, actor, "gave up", transient, failure_reason=reason),
        )
        if ok:
            for it in run.items.values():
                if it.state == "in_progress":
                    it.end_attempt("abandoned", "retryable", None)
            run.go("failed")
            run.failure_kind = "transient" if transient else "permanent"
            # rule 16 of the rule book: a failed run always has a reason, by role when none is given
            run.failure_reason = reason or (
                "operator_decision" if actor.role == "operator" else "controller_decision"
            )

    # these share rules so that, with rules drawn evenly, runs are not ended in every other step
    @precondition(lambda self: self.order)
    @rule(
        kind=st.sampled_from(["pause", "resume", "request_review", "decide", "amend"]),
        pick=PICK,
        who=WHO,
        rev=REV,
        right=st.booleans(),
        stale=st.booleans(),
        approve=st.booleans(),
        change=st.sampled_from(["add", "withdraw", "policy"]),
        item=PICK,
        max_attempts=st.integers(1, 3),
    )
    def lifecycle(
        self,
        kind: str,
        pick: int,
        who: int,
        rev: str | None,
        right: bool,
        stale: bool,
        approve: bool,
        change: str,
        item: int,
        max_attempts: int,
    ) -> None:
        if kind == "amend":
            self.amend(pick, who, change, item, max_attempts)
        elif kind == "pause":
            self.pause(pick, who, rev)
        elif kind == "resume":
            self.resume(pick, who, rev)
        elif kind == "request_review":
            self.request_review(pick, who, right)
        else:
            self.decide(pick, who, stale and not right, approve)

    @precondition(lambda self: self.order)
    @rule(
        kind=st.sampled_from(["cancel", "complete", "complete", "fail"]),
        pick=PICK,
        who=WHO,
        rev=REV,
        transient=st.booleans(),
        reason=st.sampled_from([None, "input_unavailable", "invariant_violated"]),
    )
    def end(
        self, kind: str, pick: int, who: int, rev: str | None, transient: bool, reason: str | None
    ) -> None:
        if kind == "cancel":
            self.cancel(pick, who)
        elif kind == "complete":
            self.complete(pick, who, rev)
        else:
            self.fail(pick, who, transient, reason)

    def amend(self, pick: int, who: int, kind: str, item: int, max_attempts: int) -> None:
        run = self.run(pick, "queued", "running", "paused", "pausing", "awaiting_review")
        actor = pick_actor({"submitter", "operator"}, who)
        ids = list(run.items)
        target = run.items[ids[item % len(ids)]]
        kwargs: dict[str, Any] = {}
        if kind == "add":
            self.fresh += 1
            new_id = f"n{self.fresh}"
            kwargs["items"] = [{"item_id": new_id, "required": item % 2 == 0}]
        elif kind == "withdraw":
            kwargs["withdraw"] = [target.item_id]
        else:
            kwargs["policy"] = {"max_attempts": max_attempts}
        err = self.run_checks(run, actor, {"submitter", "operator"}, None, None)
        if err is None and run.state in TERMINAL_RUN_STATES:
            err = E.AlreadyTerminal
        elif (err is None and run.state == "canceling") or (
            err is None
            and kind == "withdraw"
            and (target.state not in EDITABLE or not target.in_manifest)
        ):
            err = E.IllegalTransition
        # rule 13 of the rule book: raising max_attempts after an attempt failed or expired weakens
        # acceptance: refused to the submitter, an operator's (with a reason) is recorded as
        # a transition of its own before the amendment
        weakens = (
            kind == "policy"
            and max_attempts > run.policy["max_attempts"]
            and any(
                o in ("failed", "lease_expired") for it in run.items.values() for o in it.outcomes
            )
        )
        if err is None and weakens and actor.role == "submitter":
            err = E.NotAuthorized
        ok, status = self.call(err, lambda: self.lg.amend(run.run_id, actor, "amended", **kwargs))
        if not ok:
            return
        run.revision += 2 if weakens else 1
        if kind == "add":
            run.items[new_id] = MItem(new_id, item % 2 == 0)
        elif kind == "withdraw":
            target.move("skipped")
            target.in_manifest = False
        else:
            run.policy["max_attempts"] = max_attempts
        if kind != "policy":
            assert status.input_version != run.input_version  # the content changed
        run.input_version = status.input_version
        if run.state == "awaiting_review" and run.review is not None:
            run.review["bound"] = run.input_version

    def new_linked(
        self,
        run: MRun,
        who: int,
        roles: set[str],
        command: str,
        eligible: bool,
        items: list[MItem],
        policy: dict[str, Any],
    ) -> None:
        actor = pick_actor(roles, who)
        err = self.run_checks(run, actor, roles, None, None)
        if err is None and not eligible:
            err = E.IllegalTransition
        if err is None and not items:
            err = E.InvalidInput
        # rule 15 of the rule book: one open linked run per relation (checked after the rest here)
        open_child = run.linked.get(command)
        if (
            err is None
            and open_child is not None
            and self.runs[open_child].state not in TERMINAL_RUN_STATES
        ):
            err = E.Conflict
        calls = {
            "retry": lambda: self.lg.retry(run.run_id, actor),
            "repair": lambda: self.lg.repair(run.run_id, actor),
            "compensate": lambda: self.lg.compensate(run.run_id, actor, "undo it"),
        }
        ok, status = self.call(err, calls[command])
        if ok:
            # a compensation run carries no review: weaker than a reviewed original
            weakened = command == "compensate" and run.policy.get("review") is not None
            self.add_run(status, [(it.item_id, it.required) for it in items], policy, weakened)
            assert status.links[0].run_id == run.run_id
            run.linked[command] = status.run_id

    @precondition(
        lambda self: (
            len(self.order) < 6 and any(r.state in TERMINAL_RUN_STATES for r in self.runs.values())
        )
    )
    @rule(pick=PICK, who=WHO, command=st.sampled_from(["retry", "repair", "compensate"]))
    def linked(self, pick: int, who: int, command: str) -> None:
        run = self.run(pick, *TERMINAL_RUN_STATES)
        in_manifest = [it for it in run.items.values() if it.in_manifest]
        terminal = run.state in TERMINAL_RUN_STATES
        if command == "retry":
            eligible = run.state == "failed" and run.failure_kind == "transient"
            self.new_linked(
                run, who, {"submitter", "operator"}, command, eligible, in_manifest, run.policy
            )
        elif command == "repair":
            items = [it for it in in_manifest if it.state != "accepted"]
            self.new_linked(
                run, who, {"submitter", "operator"}, command, terminal, items, run.policy
            )
        else:
            items = [it for it in in_manifest if it.state == "accepted"]
            policy = {
                **run.policy,
                "review": None,
                "partial_delivery": False,
                "tolerated_failures": None,
            }
            self.new_linked(run, who, {"operator"}, command, terminal, items, policy)

    # -- item commands ------------------------------------------------------
    @precondition(lambda self: self.order)
    @rule(pick=PICK, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), wrong=WHO)
    def claim(self, pick: int, worker: Actor, limit: int, wrong: int) -> None:
        run = self.run(pick, "running")
        actor = pick_actor({"worker"}, wrong) if wrong >= 10 else worker
        err = self.run_checks(run, actor, {"worker"}, None, ("running",))
        now = self.now()
        past = run.past_item_deadline(now)
        claimable = [
            it
            for it in run.items.values()
            if it.state == "pending"
            or (
                not past and it.state == "retryable" and (it.eligible is None or it.eligible <= now)
            )
        ][:limit]
        ok, leases = self.call(err, lambda: self.lg.claim(run.run_id, actor, limit=limit))
        if not ok:
            return
        assert [le.item_id for le in leases] == [it.item_id for it in claimable]
        for le, it in zip(leases, claimable, strict=True):
            it.attempts += 1
            it.outcomes.append(None)
            it.token, it.worker = le.token, actor.id
            it.expires = now + timedelta(seconds=run.policy["lease_seconds"])
            it.move("in_progress")
            assert (le.attempt, le.expires_at, le.worker_id) == (it.attempts, it.expires, actor.id)
            self.leases.append(le)

    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        worker=st.sampled_from(WORKERS),
        kinds=st.lists(
            st.sampled_from(["accept", "accept", "accept", "reject", "fail", "fail_final"]),
            min_size=2,
            max_size=4,
        ),
    )
    def work(self, pick: int, worker: Actor, kinds: list[str]) -> None:
        """A worker's pass: claim some items and report an outcome for each at once."""
        before = len(self.leases)
        self.claim(pick, worker, len(kinds), 0)
        for k, kind in zip(range(before, len(self.leases)), kinds, strict=False):
            self.outcome(k, kind)

    @precondition(lambda self: self.leases)
    @rule(pick=PICK)
    def heartbeat(self, pick: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        it = self.live(lease)
        ok, new = self.call(None if it else E.LeaseLost, lambda: self.lg.heartbeat(lease))
        if ok:
            assert it is not None
            it.expires = self.now() + timedelta(
                seconds=self.runs[lease.run_id].policy["lease_seconds"]
            )
            it.revision += 1
            assert new.expires_at == it.expires and new.token == lease.token

    @precondition(lambda self: self.leases)
    @rule(pick=PICK, kind=st.sampled_from(["accept", "reject", "fail", "fail", "fail_final"]))
    def outcome(self, pick: int, kind: str) -> None:
        lease = self.leases[pick % len(self.leases)]
        run = self.runs[lease.run_id]
        it = self.live(lease)
        calls = {
            "accept": lambda: self.lg.accept(lease, evidence={"ok": True}),
            "reject": lambda: self.lg.reject(lease, "rule-1", detail="bad row"),
            "fail": lambda: self.lg.fail_attempt(lease, "flaky upstream"),
            "fail_final": lambda: self.lg.fail_attempt(lease, "broken input", retryable=False),
        }
        ok, status = self.call(None if it else E.LeaseLost, calls[kind])
        if not ok:
            return
        assert it is not None
        now = self.now()
        if kind == "accept":
            it.end_attempt("accepted", "accepted")
        elif kind == "reject":
            it.end_attempt("rejected", "rejected")
        else:
            final = (
                kind == "fail_final"
                or it.attempts >= run.policy["max_attempts"]
                or run.past_item_deadline(now)
            )
            it.end_attempt(
                "failed",
                "quarantined" if final else "retryable",
                now + timedelta(seconds=run.policy["backoff_seconds"]),
            )
        self.finish_if_drained(run)  # in the same transaction: the status shows its effect
        assert status.state == it.state

    @precondition(lambda self: any(r.state == "running" for r in self.runs.values()))
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
        policy asks, and complete it (every command checked against the model as usual)."""
        run = self.run(pick, "running")
        exact = EXACT + self.order.index(run.run_id)
        self.work(exact, worker, kinds)
        if run.state == "running" and run.policy["review"] and review:
            self.request_review(exact, 0, True)
            if run.state == "awaiting_review":
                self.decide(exact, 0, False, True)
        if run.state == "running":
            self.complete(exact, 0, None)

    outcome_again = precondition(lambda self: self.leases)(
        rule(pick=PICK, kind=st.sampled_from(["accept", "reject", "fail", "fail", "fail_final"]))(
            lambda self, pick, kind: self.outcome(pick, kind)
        )
    )

    @precondition(lambda self: self.order)
    @rule(
        pick=PICK,
        item=PICK,
        command=st.sampled_from(["skip", "release", "reject_item"]),
        who=WHO,
        rev=REV,
    )
    def item_command(self, pick: int, item: int, command: str, who: int, rev: str | None) -> None:
        run = self.run(pick, "running", "paused", "pausing", "awaiting_review")
        ids = list(run.items)
        it = run.items[ids[item % len(ids)]]
        roles = {
            "skip": {"operator", "reviewer"},
            "release": {"reviewer", "operator"},
            "reject_item": {"reviewer"},
        }[command]
        sources = {"skip": EDITABLE, "release": ("quarantined",), "reject_item": ("quarantined",)}[
            command
        ]
        actor = pick_actor(roles, who)
        expected = self.expected(rev, it.revision)
        err: type[E.LedgerError] | None = None
        if actor.role not in roles:
            err = E.NotAuthorized
        elif expected is not None and expected != it.revision:
            err = E.Conflict
        elif run.state in TERMINAL_RUN_STATES:
            err = E.AlreadyTerminal
        elif it.state not in sources:
            err = E.IllegalTransition
        calls = {
            "skip": lambda: self.lg.skip(
                run.run_id, it.item_id, actor, "not needed", expected_revision=expected
            ),
            "release": lambda: self.lg.release(
                run.run_id, it.item_id, actor, "try again", expected_revision=expected
            ),
            "reject_item": lambda: self.lg.reject_item(
                run.run_id, it.item_id, actor, "rule-2", expected_revision=expected
            ),
        }
        ok, status = self.call(err, calls[command])
        if ok:
            to = {"skip": "skipped", "release": "retryable", "reject_item": "rejected"}[command]
            if to == "retryable":
                it.eligible = self.now()
            it.move(to)
            assert status.state == to

    # -- the reconciler and the clock ----------------------------------------
    @rule(who=WHO)
    def reconcile(self, who: int) -> None:
        actor = pick_actor({"reconciler", "operator"}, who)
        if actor.role not in ("reconciler", "operator"):
            self.call(E.NotAuthorized, lambda: self.lg.reconcile(actor=actor))
            return
        now = self.now()
        expired = cancels = pauses = failed = 0
        for run in self.runs.values():
            stale = [
                it
                for it in run.items.values()
                if it.state == "in_progress" and it.expires is not None and it.expires < now
            ]
            if not stale and run.state not in (
                "running",
                "awaiting_review",
                "pausing",
                "paused",
                "canceling",
            ):
                continue
            past = run.past_item_deadline(now)
            was_retryable = [it for it in run.items.values() if it.state == "retryable"]
            for it in stale:
                exhausted = it.attempts >= run.policy["max_attempts"]
                it.end_attempt(
                    "lease_expired",
                    "quarantined" if exhausted or past else "retryable",
                    now + timedelta(seconds=run.policy["backoff_seconds"]),
                )
                expired += 1
            if past and run.state not in TERMINAL_RUN_STATES:
                for it in was_retryable:
                    it.move("quarantined")
            finished = self.finish_if_drained(run)
            cancels += finished == "cancel"
            pauses += finished == "pause"
            rd = run.policy["run_deadline_seconds"]
            if (
                rd is not None
                and run.started_at is not None
                and run.counts()["in_progress"] == 0
                and run.state in ("running", "awaiting_review", "pausing", "paused")
                and now > run.started_at + timedelta(seconds=rd)
            ):
                run.go("failed")
                run.failure_kind, run.failure_reason = "transient", "deadline_exceeded"
                failed += 1
        _, report = self.call(None, lambda: self.lg.reconcile(actor=actor))
        assert (
            report.expired_leases,
            report.finished_cancels,
            report.finished_pauses,
            report.failed_runs,
        ) == (expired, cancels, pauses, failed)

    @rule(seconds=st.sampled_from([1, 4, 5, 10, 11, 29, 31, 61, 101]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- agreement after every step ------------------------------------------
    @invariant()
    def ledger_agrees_with_model(self) -> None:
        if not self.order:
            return
        statuses = {s.run_id: s for s in self.lg.runs(limit=100)}
        assert set(statuses) == set(self.order)
        for run_id in self.order:
            m, s = self.runs[run_id], statuses[run_id]
            assert (s.state, s.revision, s.failure_kind, s.failure_reason, s.input_version) == (
                m.state,
                m.revision,
                m.failure_kind,
                m.failure_reason,
                m.input_version,
            ), run_id
            assert s.counts == m.counts()
            assert s.waiting_on == m.waiting_on(self.clock())
            got = [
                (i.item_id, i.state, i.attempts, i.revision, i.lease.token if i.lease else None)
                for i in self.lg.items(run_id)
            ]
            want = [
                (it.item_id, it.state, it.attempts, it.revision, it.token)
                for it in m.items.values()
            ]
            assert got == want
            attempts: dict[str, list[tuple[int, str | None]]] = {}
            for a in self.lg.attempts(run_id):
                attempts.setdefault(a.item_id, []).append((a.attempt, a.outcome))
            for it in m.items.values():
                assert sorted(attempts.get(it.item_id, [])) == [
                    (k + 1, o) for k, o in enumerate(it.outcomes)
                ]


# --------------------------------------------------------------------------
# one test per store
# --------------------------------------------------------------------------
def _machine(opener: Callable[[], tuple[str, Callable[[], None]]]) -> type[LedgerMachine]:
    return type("Machine", (LedgerMachine,), {"opener": staticmethod(opener)})


def test_stateful_memory() -> None:
    machine = _machine(lambda: ("memory://", lambda: None))
    run_state_machine_as_test(machine, settings=settings(profile()))


def test_stateful_sqlite() -> None:
    def opener() -> tuple[str, Callable[[], None]]:
        folder = tempfile.mkdtemp(prefix="ledger-stateful-")
        return f"sqlite:///{folder}/ledger.db", lambda: shutil.rmtree(folder, ignore_errors=True)

    base = profile()
    run_state_machine_as_test(
        _machine(opener), settings=settings(base, max_examples=base.max_examples // 5)
    )


@pytest.mark.postgres
def test_stateful_postgres(pg_databases: Any, pg_template_dsn: str) -> None:
    def opener() -> tuple[str, Callable[[], None]]:
        name, dsn = pg_databases.create()
        return dsn, lambda: pg_databases.drop(name)

    base = profile()
    run_state_machine_as_test(
        _machine(opener), settings=settings(base, max_examples=base.max_examples // 25)
    )
