"""The command registry: every write command declared once, with its handler, its row
in the rule book (roles, states, evidence), its CLI command and whether it creates a
run. `Ledger` runs each command through its entry (`Ledger._execute` refuses a handler
that has none); docs, CLI help and HTTP summaries can render from `summary`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import states as S
from . import amend, items, leases, lineage, reconcile, review, runs


@dataclass(frozen=True)
class CommandSpec:
    """One write command: name, handler, rule-book row, CLI name, creates_run."""

    name: str
    handler: Callable[..., Any]
    rule: S.Rule
    cli: str | None = None  # the `ledger` command that makes it, if any
    creates_run: bool = False  # 201 + Location over HTTP

    @property
    def roles(self) -> frozenset[str]:
        """Who may make the command."""
        return self.rule.roles

    @property
    def arguments(self) -> tuple[str, ...]:
        """The command's arguments, in order (the handler's, without the unit of work)."""
        return tuple(inspect.signature(self.handler).parameters)[1:]

    @property
    def summary(self) -> str:
        """One line: the name, the move the rule book allows, and who makes it."""
        r = self.rule
        if not r.sources:
            move = "every open run"
        else:
            sources = " or ".join(sorted(r.sources - {S.NEW})) or "a new run"
            move = f"{sources} -> {' or '.join(r.targets) or 'the same state'}"
        if r.run_states and r in S.ITEM_TRANSITIONS:
            ended = r.run_states == S.OPEN_RUN_STATES
            move += " (run not ended)" if ended else f" (run {' or '.join(sorted(r.run_states))})"
        return f"{self.name}: {move}; by {S.describe_roles(r.roles)}"


def _spec(
    handler: Callable[..., Any],
    rule: S.Rule,
    cli: str | None = None,
    creates_run: bool = False,
) -> CommandSpec:
    return CommandSpec(handler.__name__, handler, rule, cli, creates_run)


COMMANDS: dict[str, CommandSpec] = {
    spec.name: spec
    for spec in (
        _spec(lineage.submit, S.run_rule("submit"), "submit", creates_run=True),
        _spec(runs.start, S.run_rule("start"), "start"),
        _spec(review.request_review, S.run_rule("request_review"), "request-review"),
        _spec(review.decide, S.run_rule("decide"), "review"),
        _spec(review.approve, S.run_rule("decide"), "review"),
        _spec(runs.pause, S.run_rule("pause"), "pause"),
        _spec(runs.resume, S.run_rule("resume"), "resume"),
        _spec(runs.cancel, S.run_rule("cancel"), "cancel"),
        _spec(runs.complete, S.run_rule("complete"), "complete"),
        _spec(runs.fail, S.run_rule("fail"), "fail"),
        _spec(amend.amend, S.command_rule("amend"), "amend"),
        _spec(lineage.retry, S.run_rule("retry"), "retry", creates_run=True),
        _spec(lineage.repair, S.run_rule("repair"), "repair", creates_run=True),
        _spec(lineage.compensate, S.run_rule("compensate"), "compensate", creates_run=True),
        _spec(leases.claim, S.item_rule("claim"), "work"),
        _spec(leases.heartbeat, S.item_rule("heartbeat"), "work"),
        _spec(leases.accept, S.item_rule("accept"), "work"),
        _spec(leases.reject, S.item_rule("reject"), "work"),
        _spec(leases.fail_attempt, S.item_rule("fail_attempt"), "work"),
        _spec(leases.record, S.item_rule("accept"), "work"),
        _spec(items.skip, S.item_rule("skip"), "skip"),
        _spec(items.release, S.item_rule("release"), "release"),
        _spec(items.reject_item, S.item_rule("reject_item"), "reject-item"),
        _spec(reconcile.reconcile, S.command_rule("reconcile"), "reconcile"),
    )
}
