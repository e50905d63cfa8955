"""The command registry: every write command declared once, with its handler, its row
in the rule book (roles, states, evidence), its CLI command (and the role it acts in
there by default), whether it creates a run, and how it is made over HTTP. `Ledger`
runs each command through its entry (`Ledger._execute` refuses a handler that has
none); ledger/http/commands.py registers one route per `Http` entry (a command that is
not made over HTTP says why, `NotOverHttp`); docs, CLI help and HTTP summaries render
from `summary`; the CLI's default roles are `cli_default_roles()`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel

from ledger.commands import amend, items, leases, lineage, reconcile, review, runs
from ledger.commands import bodies as B
from ledger.core import states as S


@dataclass(frozen=True)
class Http:
    """How a command is made over HTTP: `POST path` with a JSON body.

    `path`: by default derived from the command's first arguments (`http_path`):
    `/runs/{run_id}/NAME`, `/runs/{run_id}/items/{item_id}/NAME` or `/leases/NAME`.
    `body`: the request body model (ledger/commands/bodies.py), None for no body. Its
    fields are the command's keyword arguments by name; for a lease command
    (`lease` first) the lease's fields make the `Lease` and the lease must be the
    caller's. The caller's token is the actor argument (`actor`, or `worker`).
    `body_required`: whether the body may be left out; by default it may when every
    field has a default. `raw_body`: the argument that is the whole body, read as raw
    JSON (submit's manifest: the ledger's own ManifestInvalid names the field).
    `doc`: the route's OpenAPI description. The answer is the facade method's view
    with 200, or 201 and `Location: /runs/{run_id}` when the command creates a run.
    """

    doc: str
    body: type[BaseModel] | None = None
    body_required: bool | None = None
    path: str | None = None
    raw_body: str | None = None

    @property
    def requires_body(self) -> bool:
        """Whether a request without a body is refused (422)."""
        if self.body_required is not None:
            return self.body_required
        if self.body is None:
            return self.raw_body is not None
        return any(f.is_required() for f in self.body.model_fields.values())


@dataclass(frozen=True)
class NotOverHttp:
    """A command that has no route of its own, and why."""

    why: str


@dataclass(frozen=True)
class CommandSpec:
    """One write command: name, handler, rule-book row, CLI name, creates_run, and its
    HTTP route (`Http`) or the reason it has none (`NotOverHttp`)."""

    name: str
    handler: Callable[..., Any]
    rule: S.Rule
    cli: str | None = None  # the `ledger` command that makes it, if any
    creates_run: bool = False  # 201 + Location over HTTP
    # the role `ledger CLI` acts in when `--as` names none, where the rule allows several
    cli_role: str | None = None
    http: Http | NotOverHttp = field(kw_only=True)

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
    def http_path(self) -> str | None:
        """The command's HTTP route (`POST`), None when it is not made over HTTP."""
        if isinstance(self.http, NotOverHttp):
            return None
        if self.http.path is not None:
            return self.http.path
        args = self.arguments
        if args[:2] == ("run_id", "item_id"):
            return f"/runs/{{run_id}}/items/{{item_id:path}}/{self.name}"
        if args[:1] == ("run_id",):
            return f"/runs/{{run_id}}/{self.name}"
        if args[:1] == ("lease",):
            return f"/leases/{self.name}"
        raise ValueError(f"{self.name}: name the HTTP path (its arguments are {args})")

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
    *,
    http: Http | NotOverHttp,
) -> CommandSpec:
    return CommandSpec(handler.__name__, handler, rule, cli, creates_run, cli_role, http=http)


# `cli_role`, where the rule allows several roles: the CLI acts as the party that makes
# the command from a terminal unless `--as` names another: the operator cancels,
# retries, repairs, skips and releases; the controller fails a run; the submitter amends
# its input; the reconciler reconciles.
# The order is the order of the HTTP routes (and of docs/openapi.json).
COMMANDS: dict[str, CommandSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            lineage.submit,
            S.run_rule("submit"),
            "submit",
            creates_run=True,
            http=Http(
                "`lg.submit(manifest, actor)`. The body is the manifest itself.",
                path="/runs",
                raw_body="manifest",
            ),
        ),
        _spec(
            runs.start,
            S.run_rule("start"),
            "start",
            http=Http("`lg.start(run_id, actor)`.", B.Expected),
        ),
        _spec(
            amend.amend,
            S.command_rule("amend"),
            "amend",
            cli_role="submitter",
            http=Http("`lg.amend(run_id, actor, reason, items, withdraw, policy)`.", B.AmendBody),
        ),
        _spec(
            leases.claim,
            S.item_rule("claim"),
            "work",
            http=Http(
                "`lg.claim(run_id, worker, limit)`: `[]` when a running run has nothing "
                "claimable.\nThe token's actor is the worker (its id becomes the leases' "
                "`worker_id`).",
                B.ClaimBody,
            ),
        ),
        _spec(
            review.request_review,
            S.run_rule("request_review"),
            "request-review",
            http=Http(
                "`lg.request_review(run_id, actor, decision, reviewer=...)`.", B.RequestReviewBody
            ),
        ),
        _spec(
            review.decide,
            S.run_rule("decide"),
            "review",
            http=Http("`lg.decide(run_id, actor, input_version, approve, reason)`.", B.DecideBody),
        ),
        _spec(
            review.approve,
            S.run_rule("decide"),
            "review",
            http=NotOverHttp("shorthand for decide(approve=True): POST /runs/{run_id}/decide"),
        ),
        _spec(
            runs.pause,
            S.run_rule("pause"),
            "pause",
            http=Http("`lg.pause(run_id, actor, reason)`: the reason is required.", B.ReasonBody),
        ),
        _spec(
            runs.resume,
            S.run_rule("resume"),
            "resume",
            http=Http(
                "`lg.resume(run_id, actor, reason=...)`: the reason is required.", B.ReasonBody
            ),
        ),
        _spec(
            runs.cancel,
            S.run_rule("cancel"),
            "cancel",
            cli_role="operator",
            http=Http(
                "`lg.cancel(run_id, actor, reason)`: durable intent; repeating it writes nothing. "
                "The reason is required.",
                B.ReasonBody,
            ),
        ),
        _spec(
            runs.complete,
            S.run_rule("complete"),
            "complete",
            http=Http(
                "`lg.complete(run_id, actor)`: 409 NotComplete names what blocks success.",
                B.Expected,
            ),
        ),
        _spec(
            runs.fail,
            S.run_rule("fail"),
            "fail",
            cli_role="controller",
            http=Http("`lg.fail(run_id, actor, reason, transient, failure_reason)`.", B.FailBody),
        ),
        _spec(
            lineage.retry,
            S.run_rule("retry"),
            "retry",
            creates_run=True,
            cli_role="operator",
            http=Http(
                "`lg.retry(run_id, actor)`: replays the original's latest input exactly.",
                B.RetryBody,
            ),
        ),
        _spec(
            lineage.repair,
            S.run_rule("repair"),
            "repair",
            creates_run=True,
            cli_role="operator",
            http=Http(
                "`lg.repair(run_id, actor, items, corrections, reason, config_version, policy)`.",
                B.RepairBody,
            ),
        ),
        _spec(
            lineage.compensate,
            S.run_rule("compensate"),
            "compensate",
            creates_run=True,
            http=Http("`lg.compensate(run_id, actor, reason, items)`.", B.CompensateBody),
        ),
        _spec(
            items.skip,
            S.item_rule("skip"),
            "skip",
            cli_role="operator",
            http=Http("`lg.skip(run_id, item_id, actor, reason)`.", B.ReasonBody),
        ),
        _spec(
            items.release,
            S.item_rule("release"),
            "release",
            cli_role="operator",
            http=Http("`lg.release(run_id, item_id, actor, reason)`.", B.ReasonBody),
        ),
        _spec(
            items.reject_item,
            S.item_rule("reject_item"),
            "reject-item",
            http=Http("`lg.reject_item(run_id, item_id, actor, rule, detail)`.", B.RejectItemBody),
        ),
        _spec(
            leases.heartbeat,
            S.item_rule("heartbeat"),
            "work",
            http=Http(
                "`lg.heartbeat(lease)`: 409 LeaseLost when the lease is not live.", B.LeaseBody
            ),
        ),
        _spec(
            leases.accept,
            S.item_rule("accept"),
            "work",
            http=Http("`lg.accept(lease, evidence, stage)`.", B.AcceptBody),
        ),
        _spec(
            leases.reject,
            S.item_rule("reject"),
            "work",
            http=Http("`lg.reject(lease, rule, detail, stage)`.", B.RejectBody),
        ),
        _spec(
            leases.fail_attempt,
            S.item_rule("fail_attempt"),
            "work",
            http=Http("`lg.fail_attempt(lease, error, stage, retryable)`.", B.FailAttemptBody),
        ),
        _spec(
            leases.record,
            S.item_rule("accept"),
            "work",
            http=NotOverHttp(
                "many outcomes in one call, for in-process workers; over HTTP each outcome is "
                "its own POST /leases/{accept,reject,fail_attempt}"
            ),
        ),
        _spec(
            reconcile.reconcile,
            S.command_rule("reconcile"),
            "reconcile",
            cli_role="reconciler",
            http=Http(
                "`lg.reconcile()` at the store's clock (a caller cannot choose `now`).",
                path="/reconcile",
            ),
        ),
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
