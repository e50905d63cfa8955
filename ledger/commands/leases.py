"""Worker commands on leases: claim, heartbeat, and the outcomes accept, reject,
fail_attempt (one at a time, or many in one transaction per run with `record`)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ledger.commands.runs import finish_if_drained
from ledger.commands.sql import SQL
from ledger.commands.uow import UnitOfWork, require_item_run_state, stamp
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.args import Outcome
from ledger.core.domain import Item, Run
from ledger.core.errors import (
    IllegalTransition,
    InvalidInput,
    ItemNotFound,
    LeaseLost,
    LedgerError,
    RunNotFound,
)
from ledger.core.redact import clean_error
from ledger.core.rows import iso, item_from_row
from ledger.core.validation import check_identifier
from ledger.core.views import Actor, ItemStatus, Lease
from ledger.core.visibility import fingerprint
from ledger.reads import queries
from ledger.stores.base import Tx

MAX_CLAIM = 1000


def claim(
    uow: UnitOfWork,
    run_id: str,
    worker: Actor,
    limit: int = 1,
    expected_revision: int | None = None,
) -> list[Lease]:
    """Lease up to `limit` claimable items in one transaction; [] when none is claimable."""
    run_id = A.run_id(run_id)
    worker = A.actor(worker, "worker")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_CLAIM}, got {limit!r}")
    expected = A.revision(expected_revision)
    rule = S.item_rule("claim")

    def body(tx: Tx) -> list[Lease]:
        run = uow.guard(tx, run_id, worker, rule.roles, "claim", expected, lock="item")
        require_item_run_state(run, rule)
        now = tx.now()
        policy = run.policy
        # PostgreSQL: items another claim of this run holds are passed over (its share
        # lock on the run lets claims run side by side; rule 3: one live lease per item)
        deadline_passed = (
            policy.get("item_deadline_seconds") is not None
            and run.started_at is not None
            and now > run.started_at + timedelta(seconds=policy["item_deadline_seconds"])
        )
        if deadline_passed:
            rows = tx.fetchall(SQL.sql(tx, "claimable_pending"), (run_id, limit))
        else:
            # two index range scans (commands.sql, claimable)
            # A backward step of the store's clock (an NTP step, a VM restored) leaves
            # items scheduled on the clock as it was: an eligible_at more than one
            # backoff ahead cannot come from this clock, so the item is due now rather
            # than frozen for the size of the step (its claim records the step)
            ahead = iso(now + timedelta(seconds=policy["backoff_seconds"]))
            rows = tx.fetchall(
                SQL.sql(tx, "claimable"), (run_id, limit, run_id, iso(now), ahead, limit, limit)
            )
        leases, items = [], []
        # each lease's token: 128 random bits as 32 hex digits, drawn for the batch at once
        tokens = os.urandom(16 * len(rows)).hex()
        # a lease lasts lease_seconds of the clock as it reads now, even when the
        # event's time stays at a later one already recorded (a clock stepped back)
        expires = now + timedelta(seconds=policy["lease_seconds"])
        expires_at, now_at = iso(expires), iso(now)
        for k, row in enumerate(rows):
            item = uow.materialize(row, now)
            at = stamp(now, item)
            token = tokens[32 * k : 32 * (k + 1)]
            attempt = item.attempts + 1
            evidence: dict[str, Any] = {
                "lease_token": token,
                "attempt": attempt,
                "expires_at": expires_at,
            }
            if row.get("eligible_at") is not None and row["eligible_at"] > now_at:
                evidence["clock_stepped_back"] = {
                    "scheduled": row["eligible_at"],
                    "clock": now_at,
                }
            item.transition(
                "claim",
                S.IN_PROGRESS,
                worker.id,
                worker.role,
                S.stated_reason("claim", lease=fingerprint(token)),
                evidence,
                at,
                run.state,
            )
            items.append(item)
            leases.append(
                Lease(
                    run_id,
                    item.item_id,
                    token,
                    worker.id,
                    attempt,
                    expires,
                    json.loads(row["payload"]),
                )
            )
        uow.commit(tx, {run_id: run}, items)
        return leases

    return uow.item_write(body)


def check_lease(
    uow: UnitOfWork,
    tx: Tx,
    run: Run,
    lease: Lease,
    now: datetime,
    row: dict[str, Any] | None = None,
) -> tuple[Item, dict[str, Any]]:
    """The item under a live lease, or LeaseLost (another lease, ended, or expired)."""
    if row is None:
        # locked: an outcome and a concurrent one on the same item (its run only share
        # locked) are decided one after the other, the second on the first's result
        row = uow.locked_item_row(tx, lease.run_id, lease.item_id)
    item = uow.track(item_from_row(row))
    if (
        item is None
        or item.state != S.IN_PROGRESS
        or item.lease_token != lease.token
        or item.lease_worker != lease.worker_id
    ):
        state = row["state"]
        raise LeaseLost(
            f"lease {lease.token[:8]} on item {lease.item_id!r} of run {lease.run_id} is not "
            f"live: the item is {state}"
            + (" under another lease" if state == S.IN_PROGRESS else "")
            + "; stop working on it"
        )
    assert item.lease_expires_at is not None
    if item.lease_expires_at < iso(now):  # type: ignore[operator]
        raise LeaseLost(
            f"lease {lease.token[:8]} on item {lease.item_id!r} of run {lease.run_id} expired "
            f"at {item.lease_expires_at}; stop working on it"
        )
    return item, row


def heartbeat(uow: UnitOfWork, lease: Lease) -> Lease:
    """Extend a live lease by the run's lease_seconds; LeaseLost if it is not live."""
    lease = A.lease(lease)

    def body(tx: Tx) -> Lease:
        run = uow.load_run(tx, lease.run_id, lock="item")
        now = tx.now()
        item, row = check_lease(uow, tx, run, lease, now)
        require_item_run_state(run, S.item_rule("heartbeat"))
        at = stamp(now, item)
        expires = now + timedelta(seconds=run.policy["lease_seconds"])  # as claim's
        item.extend_lease(iso(expires) or "", lease.worker_id, at, run.state)
        uow.commit(tx, {run.run_id: run}, [item])
        return Lease(
            lease.run_id,
            lease.item_id,
            lease.token,
            lease.worker_id,
            item.attempts,
            expires,
            json.loads(row["payload"]),
        )

    return uow.item_write(body)


OUTCOME_COMMANDS = {"accept": "accept", "reject": "reject", "fail": "fail_attempt"}


def required_evidence(run: Run, o: Outcome) -> None:
    """rule 16 of the rule book: `accept` carries the evidence keys `policy.acceptance.evidence` names."""
    keys = (run.policy.get("acceptance") or {}).get("evidence") or []
    given = o.evidence or {}
    missing = [k for k in keys if given.get(k) is None]
    if missing:
        raise InvalidInput(
            f"accept of item {o.lease.item_id!r} of run {run.run_id} needs evidence "
            f"{', '.join(missing)} (policy.acceptance.evidence: {', '.join(keys)})"
        )


def apply_outcome(
    uow: UnitOfWork,
    tx: Tx,
    run: Run,
    o: Outcome,
    now: datetime,
    row: dict[str, Any] | None = None,
) -> Item:
    """The item's transition for one outcome under its live lease (not yet committed)."""
    item, _row = check_lease(uow, tx, run, o.lease, now, row)
    # after the lease: a fenced worker hears LeaseLost; a lease still live on an ended run
    # (histories from before the rule book) is refused by the run's state
    require_item_run_state(run, S.item_rule(OUTCOME_COMMANDS[o.kind]))
    if o.kind == "accept":
        required_evidence(run, o)
    at = stamp(now, item)
    base = {"lease_token": o.lease.token, "attempt": item.attempts, "stage": o.stage}
    if o.kind == "accept":
        item.transition(
            "accept",
            S.ACCEPTED,
            o.lease.worker_id,
            S.WORKER,
            S.stated_reason("accept"),
            {**base, "outcome": "accepted", "evidence": o.evidence or {}},
            at,
            run.state,
        )
    elif o.kind == "reject":
        item.transition(
            "reject",
            S.REJECTED,
            o.lease.worker_id,
            S.WORKER,
            S.stated_reason("reject", rule=o.rule),
            {**base, "outcome": "rejected", "rule": o.rule, "detail": o.detail},
            at,
            run.state,
        )
    else:
        policy = run.policy
        deadline = policy.get("item_deadline_seconds")
        past = (
            deadline is not None
            and run.started_at is not None
            and at > run.started_at + timedelta(seconds=deadline)
        )
        exhausted = item.attempts >= policy["max_attempts"]
        error = clean_error(o.error or "")
        if not o.retryable or exhausted or past:
            why = S.stated_reason(
                "fail_attempt.not_retryable"
                if not o.retryable
                else "fail_attempt.exhausted"
                if exhausted
                else "fail_attempt.deadline",
                attempts=item.attempts,
                max_attempts=policy["max_attempts"],
            )
            item.transition(
                "fail_attempt",
                S.QUARANTINED,
                o.lease.worker_id,
                S.WORKER,
                why,
                {**base, "outcome": "failed", "error": error},
                at,
                run.state,
            )
        else:
            eligible = now + timedelta(seconds=policy["backoff_seconds"])  # as claim's
            item.transition(
                "fail_attempt",
                S.RETRYABLE,
                o.lease.worker_id,
                S.WORKER,
                S.stated_reason("fail_attempt.retryable"),
                {**base, "outcome": "failed", "error": error, "eligible_at": iso(eligible)},
                at,
                run.state,
            )
    return item


def _outcome(uow: UnitOfWork, o: Outcome) -> ItemStatus:
    def body(tx: Tx) -> ItemStatus:
        run = uow.load_run(tx, o.lease.run_id, lock="item")
        now = tx.now()
        item = apply_outcome(uow, tx, run, o, now)
        uow.commit(tx, {run.run_id: run}, [item])
        finish_if_drained(uow, tx, run, now)
        return queries.item_status_tx(tx, run.run_id, item.item_id)

    return uow.item_write(body)


def accept(
    uow: UnitOfWork,
    lease: Lease,
    evidence: dict[str, Any] | None = None,
    stage: str | None = None,
) -> ItemStatus:
    """in_progress -> accepted, with the live lease's token."""
    return _outcome(
        uow, Outcome(A.lease(lease), "accept", evidence=A.evidence(evidence), stage=A.stage(stage))
    )


def reject(
    uow: UnitOfWork,
    lease: Lease,
    rule: str,
    detail: str | None = None,
    stage: str | None = None,
) -> ItemStatus:
    """in_progress -> rejected (the item breaks a rule; final)."""
    rule = check_identifier(rule, "rule")
    return _outcome(
        uow,
        Outcome(
            A.lease(lease),
            "reject",
            rule=rule,
            detail=A.reason(detail, "detail"),
            stage=A.stage(stage),
        ),
    )


def fail_attempt(
    uow: UnitOfWork,
    lease: Lease,
    error: str,
    stage: str | None = None,
    retryable: bool = True,
) -> ItemStatus:
    """in_progress -> retryable, or quarantined when attempts are exhausted or not retryable."""
    if not isinstance(error, str):
        raise InvalidInput(f"error must be a string, got {type(error).__name__}")
    A.boolean(retryable, "retryable")
    return _outcome(
        uow,
        Outcome(A.lease(lease), "fail", error=error, stage=A.stage(stage), retryable=retryable),
    )


def record(uow: UnitOfWork, outcomes: Sequence[Outcome]) -> list[ItemStatus | LedgerError]:
    """Record many outcomes, one transaction per run. A lost lease is returned, not raised."""
    if not isinstance(outcomes, (list, tuple)):
        raise InvalidInput(f"outcomes must be a list of Outcome, got {type(outcomes).__name__}")
    checked: list[Outcome] = []
    for o in outcomes:
        if not isinstance(o, Outcome) or o.kind not in ("accept", "reject", "fail"):
            raise InvalidInput(
                "record takes Outcome(lease, kind='accept'|'reject'|'fail', ...) values"
            )
        checked.append(
            Outcome(
                A.lease(o.lease),
                o.kind,
                A.evidence(o.evidence),
                A.stage(o.stage),
                o.rule,
                A.reason(o.detail, "detail"),
                o.error,
                o.retryable,
            )
        )
    results: dict[int, ItemStatus | LedgerError] = {}
    by_run: dict[str, list[int]] = {}
    for i, o in enumerate(checked):
        by_run.setdefault(o.lease.run_id, []).append(i)

    def one_run(tx: Tx, run_id: str, idxs: list[int]) -> None:
        for i in idxs:  # a repeated transaction starts from nothing
            results.pop(i, None)
        try:
            run = uow.load_run(tx, run_id, lock="item")
        except RunNotFound as e:
            for i in idxs:
                results[i] = e
            return
        now = tx.now()
        rows = uow.item_rows(tx, run_id, [checked[i].lease.item_id for i in idxs], lock=True)
        items: list[Item] = []
        done: dict[str, Item] = {}
        for i in idxs:
            o = checked[i]
            if o.lease.item_id in done:
                results[i] = InvalidInput(
                    f"item {o.lease.item_id!r} appears twice in one record call"
                )
                continue
            row = rows.get(o.lease.item_id)
            if row is None:
                results[i] = ItemNotFound(run_id, o.lease.item_id)
                continue
            try:
                item = apply_outcome(uow, tx, run, o, now, row)
            except (LeaseLost, IllegalTransition, InvalidInput) as e:
                results[i] = e  # this outcome only: the others of the run still count
                continue
            items.append(item)
            done[o.lease.item_id] = item
        uow.commit(tx, {run_id: run}, items)
        finish_if_drained(uow, tx, run, now)
        for i in idxs:
            if i not in results:
                item_id = checked[i].lease.item_id
                results[i] = queries.item_status(queries.merged_row(rows[item_id], done[item_id]))

    for run_id, idxs in by_run.items():
        uow.item_write(functools.partial(one_run, run_id=run_id, idxs=idxs))
    return [results[i] for i in range(len(checked))]
