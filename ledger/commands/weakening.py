"""Weakening acceptance: one notion for every command that changes what a run must
satisfy (rule 13 of the rule book). The party under review (the submitter) may not
weaken; an operator may, with a reason, and the weakening is recorded as its own
transition (`weaken_acceptance`) on the run it weakens, visible in its history and the
audit."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from ledger.commands.sql import SQL
from ledger.core import states as S
from ledger.core.domain import Run
from ledger.core.errors import InvalidInput, NotAuthorized
from ledger.core.views import Actor
from ledger.stores.base import Tx


def weakenings(
    tx: Tx,
    run: Run,
    old: Any,
    new: Any,
    now: datetime | None = None,
    required_to_optional: Iterable[str] = (),
) -> list[str]:
    """How a change of policy or items weakens acceptance (rule 13 of the rule book), in
    words; [] if it does not. The one notion of weakening, for every command that changes
    what a run must satisfy (amend, and repair under a corrected policy or items):
    dropping or changing the review, setting survives_amendment, enabling partial delivery,
    raising tolerated failures, raising max_attempts after failures, dropping required
    evidence, turning required items optional (`required_to_optional`), and, for the same
    run (`now` given), removing or extending a deadline that has already passed (extending
    one before it passes is an ordinary amendment)."""
    out: list[str] = []
    if old.review is not None:
        if new.review is None:
            out.append("removes the review")
        elif new.review.decision != old.review.decision:
            out.append(f"changes the review decision to {new.review.decision!r}")
        elif new.review.survives_amendment and not old.review.survives_amendment:
            out.append("sets survives_amendment")
    if new.partial_delivery and not old.partial_delivery:
        out.append("enables partial_delivery")
    elif new.partial_delivery:
        required = tx.fetchone(SQL.sql(tx, "required_items_counted"), (run.run_id,))
        n = int((required or {"n": 0})["n"])
        # compared on the run's size, and on a large one, so "50%" vs 3 compares fairly
        if any(new.tolerated(k) > old.tolerated(k) for k in (n, 10_000_000)):
            out.append("raises tolerated_failures")
    if new.max_attempts > old.max_attempts and had_failures(tx, run):
        out.append("raises max_attempts after failures")
    dropped = set(old.acceptance.evidence) - set(new.acceptance.evidence)
    if dropped:
        out.append(f"drops required evidence {', '.join(sorted(dropped))}")
    optional = sorted(set(required_to_optional))
    if optional:
        out.append(f"makes required item(s) {', '.join(optional)} optional")
    if now is not None and run.started_at is not None:
        for field, what in (
            ("run_deadline_seconds", "run deadline"),
            ("item_deadline_seconds", "item deadline"),
        ):
            before, after = getattr(old, field), getattr(new, field)
            if before is None or now <= run.started_at + timedelta(seconds=before):
                continue  # no deadline, or not passed yet: changing it weakens nothing
            if after is None:
                out.append(f"removes the {what}, which passed")
            elif after > before:
                out.append(f"extends the {what}, which passed")
    return out


def had_failures(tx: Tx, run: Run) -> bool:
    """Whether any attempt of the run has failed or expired."""
    return tx.fetchone(SQL.sql(tx, "run_retried"), (run.run_id,)) is not None


def govern(run: Run, actor: Actor, reason: str | None, weakened: list[str]) -> None:
    """A weakening amendment: refused for the submitter (the party under review), allowed to
    an operator only with a reason (rule 13 of the rule book)."""
    rule = S.command_rule("weaken_acceptance")
    what = "; ".join(weakened)
    if actor.role not in rule.roles:
        raise NotAuthorized(
            f"role {actor.role!r} may not weaken the acceptance of run {run.run_id} ({what}); "
            f"allowed roles: {S.describe_roles(rule.roles)}, with a reason"
        )
    if reason is None or not reason.strip():
        raise InvalidInput(
            f"a change that weakens acceptance ({what}) needs a reason: it is recorded "
            "as its own transition"
        )


__all__ = ["govern", "had_failures", "weakenings"]
