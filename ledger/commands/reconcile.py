"""The reconciler pass: expire stale leases, finish cancels and pauses, quarantine
retryable items past their deadline, fail runs past their deadline."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ledger.commands.runs import finish_if_drained
from ledger.commands.sql import SQL
from ledger.commands.uow import UnitOfWork, require_role, stamp
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.errors import InvalidInput
from ledger.core.rows import iso
from ledger.core.views import Actor, ReconcileReport


def reconcile(
    uow: UnitOfWork, now: datetime | None = None, actor: Actor | None = None
) -> ReconcileReport:
    """Expire stale leases, finish cancels and pauses, quarantine retryable items past their
    deadline, and fail runs past their deadline once none of their leases is live."""
    if now is not None and (not isinstance(now, datetime) or now.tzinfo is None):
        raise InvalidInput("now must be an aware datetime")
    actor = A.actor(actor or Actor("reconciler", S.RECONCILER))
    require_role(actor, S.command_rule("reconcile").roles, "reconcile")
    expired = cancels = pauses = failed = 0
    with uow.read() as tx:
        clock = tx.now()
        if now is not None and now > clock:
            # rule 14 of the rule book: the record never leads the store's clock (tests inject a clock)
            raise InvalidInput(
                f"now {now.isoformat()} is later than the store's clock {clock.isoformat()}; "
                "reconcile may look back, never ahead"
            )
        t = now or clock
        stale = tx.fetchall(SQL.sql(tx, "runs_with_expired_leases"), (iso(t),))
        open_runs = tx.fetchall(SQL.sql(tx, "runs_to_reconcile"))
    run_ids = list(dict.fromkeys([r["run_id"] for r in stale] + [r["run_id"] for r in open_runs]))
    for run_id in run_ids:
        # each run's pass retried on its own: a fault on one run neither repeats nor
        # drops the counts of the runs already reconciled (reconciling is idempotent)
        e, c, p, f = uow.retry_step(reconcile_run, uow, run_id, now, actor)
        expired += e
        cancels += c
        pauses += p
        failed += f
    return ReconcileReport(expired, cancels, pauses, failed)


def reconcile_run(
    uow: UnitOfWork, run_id: str, now_arg: datetime | None, actor: Actor
) -> tuple[int, int, int, int]:
    """One run's pass, in one transaction: (expired, cancels, pauses, failed)."""
    with uow.write() as tx:
        run = uow.load_run(tx, run_id)
        if S.is_terminal(run.state):
            return 0, 0, 0, 0  # its items never change (rule 12 of the rule book)
        now = now_arg or tx.now()
        policy = run.policy
        # a lease set to expire more than lease_seconds ahead was granted by a clock that
        # has since stepped back: the ledger cannot tell how long it has been held, so it
        # ends as an expired one would (its holder gets LeaseLost) rather than freezing
        # the item for the size of the step
        ahead = iso(tx.now() + timedelta(seconds=policy["lease_seconds"])) or ""  # the clock
        rows = tx.fetchall(SQL.sql(tx, "expired_leases_of_run"), (run_id, iso(now), ahead))
        deadline = policy.get("item_deadline_seconds")
        past_item_deadline = (
            deadline is not None
            and run.started_at is not None
            and now > run.started_at + timedelta(seconds=deadline)
        )
        items = []
        for row in rows:
            item = uow.materialize(row, now)
            exhausted = item.attempts >= policy["max_attempts"]
            to = S.QUARANTINED if exhausted or past_item_deadline else S.RETRYABLE
            ev: dict[str, Any] = {
                "lease_token": item.lease_token,
                "attempt": item.attempts,
                "outcome": "lease_expired",
                "expired_at": item.lease_expires_at,
            }
            if item.lease_expires_at is not None and item.lease_expires_at > ahead:
                ev["clock_stepped_back"] = {"scheduled": item.lease_expires_at, "clock": iso(now)}
            if to == S.RETRYABLE:
                ev["eligible_at"] = iso(now + timedelta(seconds=policy["backoff_seconds"]))
            item.transition(
                "expire",
                to,
                actor.id,
                actor.role,
                "lease expired" + (" (attempts exhausted)" if exhausted else ""),
                ev,
                stamp(now, item),
                run.state,
            )
            items.append(item)
        if past_item_deadline:
            for row in tx.fetchall(SQL.sql(tx, "retryable_items"), (run_id,)):
                item = uow.materialize(row, now)
                item.transition(
                    "deadline",
                    S.QUARANTINED,
                    actor.id,
                    actor.role,
                    "item deadline passed",
                    {},
                    stamp(now, item),
                    run.state,
                )
                items.append(item)
        uow.commit(tx, {run_id: run}, items)
        cancels = pauses = failed = 0
        finished = finish_if_drained(uow, tx, run, now)
        cancels += finished == "cancel"
        pauses += finished == "pause"
        rd = policy.get("run_deadline_seconds")
        if (
            rd is not None
            and run.started_at is not None
            and run.counts[S.IN_PROGRESS] == 0
            and run.state in S.run_rule("reconcile_deadline").sources
            and now > run.started_at + timedelta(seconds=rd)
        ):
            run.transition(
                "reconcile_deadline",
                S.FAILED,
                actor.id,
                actor.role,
                f"run deadline of {rd:g}s passed",
                {"failure_kind": S.TRANSIENT, "failure_reason": "deadline_exceeded"},
                stamp(now, run),
            )
            uow.commit(tx, {run_id: run})
            failed = 1
        return len(rows), cancels, pauses, failed
