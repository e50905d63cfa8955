"""The command registry: every write command declared once, with its handler, its row
in the rule book (roles, states, evidence), its CLI command (and the role it acts in
there by default) and whether it creates a run. `Ledger` runs each command through its
entry (`Ledger._execute` refuses a handler that has none); docs, CLI help and HTTP
summaries render from `summary`; the CLI's default roles are `cli_default_roles()`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
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
    # the role `ledger CLI` acts in when `--as` names none, where the rule allows several
    cli_role: str | None = None

    def __post_init__(self) -> None:
        if self.cli_role is not None and self.cli_role not in self.roles:
            raise ValueError(
                f"{self.name}: cli_role {self.cli_role!r} is not one of the rule's roles "
                f"({S.describe_roles(self.roles)})"
            )
        if self.cli is not None and self.cli_role is None and len(self.roles) != 1:
            raise ValueError(
                f"{self.name}: the rule allows {S.describe_roles(self.roles)}; name the CLI's "
                "default with cli_role="
            )

    @property
    def roles(self) -> frozenset[str]:
        """Who may make the command."""
        return self.rule.roles

    @property
    def default_role(self) -> str:
        """The role the command is made in when the caller names none: the rule's only
        role, else the `cli_role` preference among the rule's roles."""
        if self.cli_role is not None:
            return self.cli_role
        (role,) = self.roles
        return role

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
    cli_role: str | None = None,
) -> CommandSpec:
    return CommandSpec(handler.__name__, handler, rule, cli, creates_run, cli_role)


# `cli_role`, where the rule allows several roles: the CLI acts as the party that makes
# the command from a terminal unless `--as` names another: the operator cancels,
# retries, repairs, skips and releases; the controller fails a run; the submitter amends
# its input; the reconciler reconciles.
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
        _spec(runs.cancel, S.run_rule("cancel"), "cancel", cli_role="operator"),
        _spec(runs.complete, S.run_rule("complete"), "complete"),
        _spec(runs.fail, S.run_rule("fail"), "fail", cli_role="controller"),
        _spec(amend.amend, S.command_rule("amend"), "amend", cli_role="submitter"),
        _spec(lineage.retry, S.run_rule("retry"), "retry", creates_run=True, cli_role="operator"),
        _spec(
            lineage.repair, S.run_rule("repair"), "repair", creates_run=True, cli_role="operator"
        ),
        _spec(lineage.compensate, S.run_rule("compensate"), "compensate", creates_run=True),
        _spec(leases.claim, S.item_rule("claim"), "work"),
        _spec(leases.heartbeat, S.item_rule("heartbeat"), "work"),
        _spec(leases.accept, S.item_rule("accept"), "work"),
        _spec(leases.reject, S.item_rule("reject"), "work"),
        _spec(leases.fail_attempt, S.item_rule("fail_attempt"), "work"),
        _spec(leases.record, S.item_rule("accept"), "work"),
        _spec(items.skip, S.item_rule("skip"), "skip", cli_role="operator"),
        _spec(items.release, S.item_rule("release"), "release", cli_role="operator"),
        _spec(items.reject_item, S.item_rule("reject_item"), "reject-item"),
        _spec(reconcile.reconcile, S.command_rule("reconcile"), "reconcile", cli_role="reconciler"),
    )
}


@cache
def cli_default_roles() -> dict[str, str]:
    """`ledger` command -> the role it acts in when `--as` names none (`default_role` of
    its registry entries, which must agree where several share a CLI command)."""
    roles: dict[str, str] = {}
    for spec in COMMANDS.values():
        if spec.cli is None:
            continue
        seen = roles.setdefault(spec.cli, spec.default_role)
        if seen != spec.default_role:
            raise ValueError(
                f"`ledger {spec.cli}` would act as {seen!r} and as {spec.default_role!r}"
            )
    return roles
