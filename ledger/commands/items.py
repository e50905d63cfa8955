"""Item commands by operators and reviewers: skip, release, reject_item."""

from __future__ import annotations

from typing import Any

from ledger.commands.uow import (
    UnitOfWork,
    check_revision,
    require_item_run_state,
    require_item_state,
    require_role,
    stamp,
)
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.rows import iso
from ledger.core.validation import check_identifier
from ledger.core.views import Actor, ItemStatus
from ledger.reads import queries


def item_command(
    uow: UnitOfWork,
    run_id: Any,
    item_id: Any,
    actor: Any,
    command: str,
    to_state: str,
    reason: str | None,
    evidence: dict[str, Any],
    expected_revision: Any,
) -> ItemStatus:
    """One item transition by the table's rule for `command` (revision is the item's)."""
    run_id = A.run_id(run_id)
    item_id = A.item_id(item_id)
    actor = A.actor(actor)
    expected = A.revision(expected_revision)
    rule = S.item_rule(command)
    with uow.write() as tx:
        run = uow.load_run(tx, run_id)
        row = uow.item_row(tx, run_id, item_id)
        require_role(actor, rule.roles, command.replace("_", " "))
        check_revision(expected, row["revision"], row["state"], f"item {item_id!r}")
        require_item_run_state(run, rule)
        now = tx.now()
        item = uow.materialize(row, now)
        require_item_state(run_id, row["state"], item_id, rule)
        extra = {"eligible_at": iso(now)} if to_state == S.RETRYABLE else {}
        item.transition(
            command,
            to_state,
            actor.id,
            actor.role,
            reason,
            {**evidence, **extra},
            stamp(now, item),
            run.state,
        )
        uow.commit(tx, {run_id: run}, [item])
        return queries.item_status_tx(tx, run_id, item_id)


def skip(
    uow: UnitOfWork,
    run_id: str,
    item_id: str,
    actor: Actor,
    reason: str | None,
    expected_revision: int | None = None,
) -> ItemStatus:
    """pending, retryable or quarantined -> skipped."""
    why = A.stated_reason(reason, "skip")
    return item_command(uow, run_id, item_id, actor, "skip", S.SKIPPED, why, {}, expected_revision)


def release(
    uow: UnitOfWork,
    run_id: str,
    item_id: str,
    actor: Actor,
    reason: str | None,
    expected_revision: int | None = None,
) -> ItemStatus:
    """quarantined -> retryable."""
    why = A.stated_reason(reason, "release")
    return item_command(
        uow, run_id, item_id, actor, "release", S.RETRYABLE, why, {}, expected_revision
    )


def reject_item(
    uow: UnitOfWork,
    run_id: str,
    item_id: str,
    actor: Actor,
    rule: str,
    detail: str | None = None,
    expected_revision: int | None = None,
) -> ItemStatus:
    """quarantined -> rejected, by a reviewer."""
    rule = check_identifier(rule, "rule")
    return item_command(
        uow,
        run_id,
        item_id,
        actor,
        "reject_item",
        S.REJECTED,
        S.stated_reason("reject_item", rule=rule),
        {"rule": rule, "detail": A.reason(detail, "detail")},
        expected_revision,
    )
