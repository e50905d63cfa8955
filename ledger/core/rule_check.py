"""The rule checker: every rule of the rule book that can be judged on an event, in one
table, and the one function every writer and `verify` call to judge an event with it.

Each row of `RULES` says what it checks and which line of the contract it serves. A
rule is a function of the event and the `Facts` just before it (the state of its run
and item, the time of its stream's last event, the run's open work and its required
items not accepted); it returns what is wrong, in words, or None.

Who calls `check_event` and where its facts come from:

- the commands, before a transaction commits (`ledger/commands/uow.py`): the state the
  transaction loaded, advanced event by event (`Overlay`); the first violation raises
  `InvariantViolated` and nothing is written;
- `verify`, over the history in position order (`ledger/projections/replay_rules.py`):
  the replay's state; every violation is reported;
- import, restore and copy (`ledger/transfer/`), on each incoming event before anything
  commits: the same replay over the target's tables; the first violation refuses the
  whole file (`InvariantViolated`, naming the rule, the stream and the event).

The rows come first in the order a command's own checks would name the problem best
(a terminal run before a state the table does not allow), so the first violation is
the most telling one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from eventsourcing.domain import CanInitAggregate

from ledger.core import states as S
from ledger.core.domain import Item, Run
from ledger.core.errors import InvariantViolated
from ledger.core.webhook_events import EVENT_OF_COMMAND, ROLES, WebhookEvent

SUCCESS_STATES = frozenset({S.ACCEPTED, S.SUCCEEDED, S.COMPLETED_WITH_ERRORS})
OPEN_ITEM_STATES = (S.PENDING, S.IN_PROGRESS, S.RETRYABLE)
RUN_CREATING_COMMANDS = ("submit", "retry", "repair", "compensate")
# transitions the ledger records by itself, with its reserved actor (SPEC: "recorded with
# actor `ledger`, role `controller`"): nothing else may carry that actor
LEDGER_COMMANDS = frozenset({"pause_finished", "cancel_finished", "cancel_skip", "abandon"})
# commands the reconcile pass records with its caller's role (a reconciler, or an
# operator running the pass by hand)
_RECONCILE_COMMANDS = frozenset({"expire", "deadline", "reconcile_deadline"})
# item commands that only the live lease's holder makes, with its token
_HOLDER_COMMANDS = frozenset({"heartbeat", "accept", "reject", "fail_attempt"})
# item commands that end a live lease on someone else's behalf (its token recorded)
_FENCING_COMMANDS = frozenset({"expire", "abandon"})


class ItemFacts(Protocol):
    """What the rules need of an item before an event: its state and its lease."""

    state: str
    lease_token: str | None
    lease_worker: str | None
    lease_expires_at: str | None


class Facts(Protocol):
    """The state just before an event, as the caller knows it."""

    def run_state(self, run_id: str) -> str | None:
        """The run's state (None: the run is not known here)."""

    def item(self, stream: UUID) -> ItemFacts | None:
        """The item of this stream (None: its stream has not begun: pending, no lease)."""

    def last_time(self, stream: UUID) -> datetime | None:
        """The time of the stream's last event (None: none yet)."""

    def item_counts(self, run_id: str) -> Mapping[str, int] | None:
        """The run's items per state (None: not known)."""

    def required_not_accepted(self, run_id: str) -> list[tuple[str, str]]:
        """The run's required items not accepted (item id, state), the first few."""

    def run(self, run_id: str) -> Any:
        """The run's aggregate (its creator, policy, input version and review), or None."""

    def amended_by(self, run_id: str, actor_id: str) -> bool:
        """Whether the actor has amended the run."""


@dataclass(frozen=True)
class Violation:
    """One rule an event breaks: the rule's name, the run, the stream and version of the
    event, the event in words and what is wrong."""

    rule: str
    run_id: str
    stream: str
    version: int
    event: str
    detail: str

    def error(
        self, position: int | None = None, when: str = "refused before commit"
    ) -> InvariantViolated:
        """The typed error naming the rule, the stream and the event."""
        where = f"position {position}: " if position is not None else ""
        return InvariantViolated(
            f"{when} (rule {self.rule}): {where}{self.event}, version {self.version} of stream "
            f"{self.stream} (run {self.run_id}): {self.detail}; nothing was written",
            kind=self.rule,
            run_id=self.run_id,
            stream=self.stream,
            version=self.version,
            position=position,
        )


class At:
    """An event as the rules see it, worked out once per event: its kind, command, table
    row, run, and the state of its run and item just before it."""

    __slots__ = ("command", "item", "kind", "row", "run_id", "run_state")

    def __init__(self, e: Any, facts: Facts) -> None:
        kind = _kind(e)
        self.kind = kind
        command = _command(e, kind)
        self.command = command
        self.row = _table_row(kind, command)
        self.run_id = run_of(e)
        self.run_state = facts.run_state(self.run_id)
        self.item = facts.item(e.originator_id) if kind in _ITEM_KINDS else None

    @property
    def item_state(self) -> str:
        """The item's state (pending while its stream has not begun)."""
        return self.item.state if self.item is not None else S.PENDING


RuleFn = Callable[[Any, Facts, At], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One row of the rule checker: its name (the `kind` of errors and of verify's
    problems), what it checks, the contract line it serves, and the check itself."""

    name: str
    checks: str
    serves: str
    check: RuleFn


# --------------------------------------------------------------------------
# what an event is (found once per class: isinstance on eventsourcing's ABCs is slow)
# --------------------------------------------------------------------------
_SUBMITTED, _CREATED, _RUN_MOVE, _AMEND, _ITEM_MOVE, _LEASE, _OTHER, _WEBHOOK = range(8)
_ITEM_KINDS = frozenset({_ITEM_MOVE, _LEASE})
_KINDS: dict[type, int] = {}


def _kind(e: Any) -> int:
    cls = type(e)
    kind = _KINDS.get(cls)
    if kind is None:
        if issubclass(cls, Run.Submitted):
            kind = _SUBMITTED
        elif issubclass(cls, CanInitAggregate):
            kind = _CREATED
        elif issubclass(cls, Run.Transitioned):
            kind = _RUN_MOVE
        elif issubclass(cls, Run.Amended):
            kind = _AMEND
        elif issubclass(cls, Item.Transitioned):
            kind = _ITEM_MOVE
        elif issubclass(cls, Item.LeaseExtended):
            kind = _LEASE
        elif issubclass(cls, WebhookEvent):
            kind = _WEBHOOK
        else:
            kind = _OTHER
        _KINDS[cls] = kind
    return kind


def run_of(e: Any) -> str:
    """The run an event belongs to."""
    return str(getattr(e, "run_id", None) or e.originator_id)


def describe(e: Any) -> str:
    """The event in words: its command and target."""
    command = _command(e, _kind(e)) or type(e).__name__
    to = getattr(e, "to_state", None)
    item = getattr(e, "item_id", None)
    text = f"{command}" + (f" -> {to}" if to else "")
    return text + (f" of item {item!r}" if item is not None else "")


def _command(e: Any, kind: int) -> str | None:
    if kind == _LEASE:
        return "heartbeat"
    if kind == _AMEND:
        return "amend"
    if kind in (_SUBMITTED, _RUN_MOVE, _ITEM_MOVE):
        return str(e.command)
    return None


_ROWS: dict[tuple[int, str | None], S.Rule | None] = {}


def _table_row(kind: int, command: str | None) -> S.Rule | None:
    """The transition table's row for an event of this kind and command (None: no row)."""
    key = (kind, command)
    if key in _ROWS:
        return _ROWS[key]
    row: S.Rule | None = None
    try:
        if kind in _ITEM_KINDS:
            row = S.item_rule(command or "")
        elif kind == _SUBMITTED:
            row = S.run_rule(command or "") if command in RUN_CREATING_COMMANDS else None
        elif kind in (_RUN_MOVE, _AMEND):
            row = S.any_run_rule(command or "")
    except KeyError:
        row = None
    if len(_ROWS) < 1000:  # commands are few; a forged file may name many
        _ROWS[key] = row
    return row


# --------------------------------------------------------------------------
# the rules
# --------------------------------------------------------------------------
def _time_backwards(e: Any, facts: Facts, at: At) -> str | None:
    last = facts.last_time(e.originator_id)
    if last is not None and e.timestamp < last:
        return (
            f"stamped {e.timestamp.isoformat()}, before the previous event of its stream "
            f"({last.isoformat()})"
        )
    return None


def _terminal_changed(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind not in (_RUN_MOVE, _AMEND):
        return None
    state = at.run_state
    if state is not None and state in S.TERMINAL_RUN_STATES:
        return f"the run is {state} (terminal) and never changes again"
    return None


def _item_after_end(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind not in _ITEM_KINDS:
        return None
    state = at.run_state
    if state is not None and state in S.TERMINAL_RUN_STATES:
        return f"the item changes after its run ended {state}; items of a terminal run never change"
    return None


def _two_leases(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind != _ITEM_MOVE or at.command != "claim":
        return None
    item = at.item
    if e.from_state == S.IN_PROGRESS or (item is not None and item.state == S.IN_PROGRESS):
        holder = item.lease_worker if item is not None else None
        return f"claimed by {e.actor_id} while the lease of {holder or 'another worker'} is live"
    return None


def _reconciler_success(e: Any, facts: Facts, at: At) -> str | None:
    if getattr(e, "role", None) == S.RECONCILER and getattr(e, "to_state", None) in SUCCESS_STATES:
        return (
            f"the reconciler {getattr(e, 'actor_id', '?')} records a success; only the party "
            "that did the work records success"
        )
    return None


def _success_unearned(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind != _RUN_MOVE or e.to_state not in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        return None
    counts = facts.item_counts(at.run_id)
    if counts is not None:
        open_ = {s: counts.get(s, 0) for s in OPEN_ITEM_STATES if counts.get(s, 0) > 0}
        if open_:
            return f"{e.to_state} with work still open: " + ", ".join(
                f"{n} {s}" for s, n in open_.items()
            )
    if e.to_state != S.SUCCEEDED:
        return None
    missing = facts.required_not_accepted(at.run_id)
    if missing:
        return "succeeded with required items not accepted: " + ", ".join(
            f"{item_id} ({state})" for item_id, state in missing[:5]
        )
    return None


def _review_independent(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind != _RUN_MOVE or at.command != "decide":
        return None
    run = facts.run(at.run_id)
    if run is not None and e.actor_id == run.created_by:
        return f"{e.actor_id} submitted the run and may not decide its review"
    if facts.amended_by(at.run_id, e.actor_id):
        return f"{e.actor_id} amended the run and may not decide its review"
    return None


def _review_version(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind != _RUN_MOVE or at.command != "decide":
        return None
    run = facts.run(at.run_id)
    review = getattr(run, "review", None) or {}
    bound = review.get("input_version")
    named = (e.evidence or {}).get("input_version")
    if bound is not None and named != bound:
        return f"the decision names input version {named}, but the review is of {bound}"
    return None


def _reserved_actor(e: Any, facts: Facts, at: At) -> str | None:
    if getattr(e, "actor_id", None) != S.LEDGER_ACTOR_ID:
        return None
    if at.command in LEDGER_COMMANDS and getattr(e, "role", S.CONTROLLER) == S.CONTROLLER:
        return None
    return (
        f"recorded by the reserved actor {S.LEDGER_ACTOR_ID!r}, which makes only the ledger's "
        f"own transitions ({', '.join(sorted(LEDGER_COMMANDS))}, role controller)"
    )


def _in_table(e: Any, facts: Facts, at: At) -> str | None:
    kind, row = at.kind, at.row
    if row is None:
        return f"no row of the transition tables names the command {at.command!r}"
    if kind in (_SUBMITTED, _LEASE):
        return None  # a heartbeat keeps the state: its source is checked by lease_holder
    if kind == _AMEND:
        frm = e.state
        return None if frm in row.sources else f"amend is allowed from {row.allowed()}, not {frm}"
    frm, to = e.from_state, e.to_state
    if frm not in row.sources:
        return f"{row.command} is allowed from {row.allowed()}, not {frm}"
    if to not in (row.targets or (frm,)):
        return f"{row.command} leads to {', '.join(row.targets) or frm}, not {to}"
    return None


def _role_allowed(e: Any, facts: Facts, at: At) -> str | None:
    row = at.row
    role = getattr(e, "role", None)
    if row is None or role is None:
        return None  # no row: transition_allowed says so; a heartbeat records no role
    if role in row.roles:
        return None
    roles = row.roles
    if row.command in _RECONCILE_COMMANDS:
        roles = roles | S.command_rule("reconcile").roles
    if row.command in LEDGER_COMMANDS:
        roles = roles | {S.CONTROLLER}
    if role in roles:
        return None
    return f"role {role!r} may not {row.command}; allowed roles: {S.describe_roles(roles)}"


def _follows_state(e: Any, facts: Facts, at: At) -> str | None:
    kind = at.kind
    if kind in (_RUN_MOVE, _AMEND):
        state = at.run_state
        said = e.from_state if kind == _RUN_MOVE else e.state
        if state is not None and said != state:
            return f"records a move from {said}, but the run is {state}"
        return None
    if kind == _ITEM_MOVE:
        state = at.item_state
        if e.from_state != state:
            return f"records a move from {e.from_state}, but the item is {state}"
    return None


def _item_run_state(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind not in _ITEM_KINDS:
        return None
    row, state = at.row, at.run_state
    if row is None or state is None or not row.run_states or state in row.run_states:
        return None
    if state in S.TERMINAL_RUN_STATES:
        return None  # item_after_end names it
    return (
        f"{row.command} of an item needs its run {', '.join(sorted(row.run_states))}, not {state}"
    )


def _lease_holder(e: Any, facts: Facts, at: At) -> str | None:
    kind, command = at.kind, at.command
    if kind == _LEASE:
        token = e.token
    elif kind == _ITEM_MOVE and (command in _HOLDER_COMMANDS or command in _FENCING_COMMANDS):
        token = (e.evidence or {}).get("lease_token")
    else:
        return None
    item = at.item
    if item is None or item.state != S.IN_PROGRESS or item.lease_token is None:
        return f"{command} needs a live lease, and the item holds none (it was never claimed)"
    if token != item.lease_token:
        return f"{command} carries lease token {token!r}, not the item's live lease"
    if command in _HOLDER_COMMANDS and e.actor_id != item.lease_worker:
        return f"{command} by {e.actor_id}, but the lease is held by {item.lease_worker}"
    return None


def _lease_expired(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind != _ITEM_MOVE or at.command != "expire":
        return None
    expires = getattr(at.item, "lease_expires_at", None)
    if expires is None:
        return None  # no live lease: lease_holder names it
    if (e.evidence or {}).get("clock_stepped_back"):
        return None  # granted by a clock that has since stepped back, and recorded so
    try:
        until = datetime.fromisoformat(expires)
    except (TypeError, ValueError):
        return f"the lease's expiry {expires!r} is not a time"
    if e.timestamp < until:
        return (
            f"the lease is expired at {e.timestamp.isoformat()}, before its expiry "
            f"({until.isoformat()}): the record would lead reality"
        )
    return None


def _evidence(e: Any, facts: Facts, at: At) -> str | None:
    if at.kind not in (_RUN_MOVE, _ITEM_MOVE):
        return None
    row = at.row
    if row is None or not row.evidence:
        return None
    evidence = e.evidence if isinstance(e.evidence, dict) else {}
    missing = [k for k in row.evidence if evidence.get(k) is None]
    if missing:
        return f"{row.command} must record evidence {', '.join(missing)}"
    return None


def _webhook_owner(e: Any, facts: Facts, at: At) -> str | None:
    if e.role not in ROLES:
        return f"role {e.role!r} may not {e.command} webhooks; allowed: {', '.join(ROLES)}"
    if not isinstance(e.reason, str) or not e.reason.strip():
        return f"the {e.command} of webhook {e.webhook_id} records no reason"
    if EVENT_OF_COMMAND.get(e.command) is not type(e):
        return f"a {type(e).__name__} event cannot record the command {e.command!r}"
    # (a stream may begin with a later command: a webhook registered before the log held
    # webhook changes has no registration event)
    if e.command == "add" and e.originator_version != 1:
        return f"webhook {e.webhook_id} is registered again at version {e.originator_version}"
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "time_backwards",
        "an event is not stamped before the previous event of its stream",
        "SPEC Clock: event times never move backwards within a stream; rule 2; "
        "seed 000: each transition identifies its time",
        _time_backwards,
    ),
    Rule(
        "terminal_changed",
        "a terminal run records no further run event",
        "SPEC Run transitions: terminal states; seed 000: terminal runs are not rewritten "
        "into a different historical outcome",
        _terminal_changed,
    ),
    Rule(
        "item_after_end",
        "no item of a terminal run changes",
        "SPEC rule 12: no item of a terminal run changes, whichever command is asked",
        _item_after_end,
    ),
    Rule(
        "two_leases",
        "an item is never claimed while its lease is live",
        "SPEC rule 3: two live leases on one item never exist; seed 000: competing workers "
        "cannot create contradictory accepted transitions",
        _two_leases,
    ),
    Rule(
        "reconciler_success",
        "the reconciler records no acceptance and no success",
        "SPEC rule 4: the reconciler never marks anything accepted or succeeded",
        _reconciler_success,
    ),
    Rule(
        "success_unearned",
        "a run ends succeeded or completed_with_errors only with no work open, and "
        "succeeded only with every required item accepted",
        "SPEC rule 5; seed 000: every required item must satisfy the acceptance rule before "
        "the run is declared succeeded",
        _success_unearned,
    ),
    Rule(
        "review_independent",
        "a review is not decided by the actor who submitted or amended the run",
        "SPEC rule 13: the actor who submitted or amended a run may not decide its review; "
        "seed 000: an authorized decision",
        _review_independent,
    ),
    Rule(
        "review_version",
        "a decision names the input version the review was requested for",
        "SPEC rule 7: a decision must name that version; seed 000: never silently attach an "
        "old decision to a materially changed package",
        _review_version,
    ),
    Rule(
        "reserved_actor",
        "the actor `ledger` records only the ledger's own transitions",
        "SPEC Concepts: transitions the ledger makes by itself are recorded with actor "
        "`ledger`, role `controller`; seed 000: the responsible actor or service",
        _reserved_actor,
    ),
    Rule(
        "transition_allowed",
        "the command has a row in the transition tables, and the move goes from one of its "
        "sources to one of its targets",
        "SPEC Run transitions and Item transitions; rule 12: the rule book is the guard",
        _in_table,
    ),
    Rule(
        "role_allowed",
        "the recorded role is one the table allows for the command",
        "SPEC Run transitions and Item transitions (roles); seed 000: who can enter each state",
        _role_allowed,
    ),
    Rule(
        "state_continues",
        "the previous state an event records is the state its run or item was in",
        "SPEC rule 1: each event carries the previous state; seed 000: previous state, new state",
        _follows_state,
    ),
    Rule(
        "item_run_state",
        "an item command happens only while its run is in a state the table allows "
        "(claims only while running)",
        "SPEC Item transitions: items are claimed only while the run is running; rule 12",
        _item_run_state,
    ),
    Rule(
        "lease_holder",
        "an outcome or heartbeat carries the live lease's token and comes from its holder; "
        "an expiry or a fence names the live lease",
        "SPEC rule 3: an outcome is accepted only with the live token; rule 4: success "
        "needs evidence from the party that did the work",
        _lease_holder,
    ),
    Rule(
        "lease_expired",
        "a lease is recorded expired only once its expiry has passed (or with the clock "
        "step that ended it recorded)",
        "SPEC rule 4: the record may lag reality but never lead it; the reconciler "
        "expires stale leases",
        _lease_expired,
    ),
    Rule(
        "evidence",
        "a transition records every evidence key its table row names",
        "SPEC rules 1 and 16: the evidence each transition requires; seed 000: what evidence "
        "must exist",
        _evidence,
    ),
    Rule(
        "webhook_owner",
        "a webhook change is an operator's, with a reason, and a webhook is registered only once",
        "SPEC rule 1: every change is an event carrying its actor and reason; the webhook's "
        "owner: registering, changing and removing a webhook is an operator command with a "
        "reason",
        _webhook_owner,
    ),
)
RULE_NAMES: tuple[str, ...] = tuple(r.name for r in RULES)


# the rules that judge each kind of event: a run's creation and events of no run or
# item (an `Archived` one) are judged by none; a creating event by the table only; a
# webhook's by its own rule
_JUDGES: dict[str, tuple[int, ...]] = {
    "time_backwards": (_RUN_MOVE, _AMEND, _ITEM_MOVE, _LEASE),
    "terminal_changed": (_RUN_MOVE, _AMEND),
    "item_after_end": (_ITEM_MOVE, _LEASE),
    "two_leases": (_ITEM_MOVE,),
    "reconciler_success": (_RUN_MOVE, _ITEM_MOVE),
    "success_unearned": (_RUN_MOVE,),
    "review_independent": (_RUN_MOVE,),
    "review_version": (_RUN_MOVE,),
    "reserved_actor": (_SUBMITTED, _RUN_MOVE, _AMEND, _ITEM_MOVE, _LEASE),
    "transition_allowed": (_SUBMITTED, _RUN_MOVE, _AMEND, _ITEM_MOVE, _LEASE),
    "role_allowed": (_SUBMITTED, _RUN_MOVE, _AMEND, _ITEM_MOVE),
    "state_continues": (_RUN_MOVE, _AMEND, _ITEM_MOVE),
    "item_run_state": (_ITEM_MOVE, _LEASE),
    "lease_holder": (_ITEM_MOVE, _LEASE),
    "lease_expired": (_ITEM_MOVE,),
    "evidence": (_RUN_MOVE, _ITEM_MOVE),
    "webhook_owner": (_WEBHOOK,),
}
_BY_KIND: dict[int, tuple[Rule, ...]] = {
    kind: tuple(r for r in RULES if kind in _JUDGES[r.name]) for kind in range(8)
}


def check_event(e: Any, facts: Facts, first: bool = False) -> list[Violation]:
    """The rules `e` breaks, given the facts just before it (the first only, when
    `first`); [] when it breaks none."""
    at = At(e, facts)
    found: list[Violation] = []
    for rule in _BY_KIND[at.kind]:
        detail = rule.check(e, facts, at)
        if detail is None:
            continue
        found.append(_violation(rule, e, at, detail))
        if first:
            break
    return found


def _violation(rule: Rule, e: Any, at: At, detail: str) -> Violation:
    return Violation(
        rule.name, at.run_id, str(e.originator_id), int(e.originator_version), describe(e), detail
    )


# --------------------------------------------------------------------------
# the facts of a transaction about to commit
# --------------------------------------------------------------------------
class _ItemNow:
    """An item's state and lease after an event of the batch."""

    __slots__ = ("lease_expires_at", "lease_token", "lease_worker", "state")

    def __init__(
        self, state: str, token: str | None, worker: str | None, expires: str | None
    ) -> None:
        self.state = state
        self.lease_token = token
        self.lease_worker = worker
        self.lease_expires_at = expires


class Overlay:
    """Facts for a batch of new events: the state the writer loaded (`runs`, the items it
    `noted`, `stamps`: each stream's last time), advanced event by event as the batch is
    checked. `required(run_id)` lists a run's required items not accepted as stored
    (item id, state); the overlay corrects it by the items this batch moved."""

    def __init__(
        self,
        runs: Mapping[str, Any],
        items: dict[UUID, ItemFacts],
        stamps: dict[UUID, datetime],
        required: Callable[[str], list[tuple[str, str]]],
        events: Sequence[Any] = (),
        amended_by: Callable[[str, str], bool] | None = None,
    ) -> None:
        self._states: dict[str, str] = {}
        for e in events:  # a run's state before the batch: its first event's from-state
            kind = _kind(e)
            if kind == _RUN_MOVE:
                self._states.setdefault(run_of(e), e.from_state)
            elif kind == _AMEND:
                self._states.setdefault(run_of(e), e.state)
        self._runs = runs
        for run_id, run in runs.items():
            self._states.setdefault(run_id, run.state)
        self._counts: dict[str, dict[str, int]] = {}
        self._items = items  # advanced in place: the writer's next batch starts from here
        self._moved: dict[UUID, tuple[str, str, str]] = {}  # stream -> run, item, state
        self.stamps = stamps
        self._required = required
        self._amended_by = amended_by
        self._amenders: set[tuple[str, str]] = set()  # amendments in this batch

    def run_state(self, run_id: str) -> str | None:
        return self._states.get(run_id)

    def item(self, stream: UUID) -> ItemFacts | None:
        return self._items.get(stream)

    def last_time(self, stream: UUID) -> datetime | None:
        return self.stamps.get(stream)

    def item_counts(self, run_id: str) -> Mapping[str, int] | None:
        run = self._runs.get(run_id)
        if run is None:
            return None
        counts = Counter(run.counts)
        counts.update(self._counts.get(run_id) or {})
        return counts

    def required_not_accepted(self, run_id: str) -> list[tuple[str, str]]:
        rows = self._required(run_id)
        now = {(r, i): s for r, i, s in self._moved.values() if r == run_id}  # this batch's moves
        return [
            (i, now.get((run_id, i), s)) for i, s in rows if now.get((run_id, i), s) != S.ACCEPTED
        ]

    def run(self, run_id: str) -> Any:
        return self._runs.get(run_id)

    def amended_by(self, run_id: str, actor_id: str) -> bool:
        if (run_id, actor_id) in self._amenders:
            return True
        return self._amended_by is not None and self._amended_by(run_id, actor_id)

    def advance(self, e: Any, kind: int | None = None) -> None:
        """Take the event into the facts (after it was checked)."""
        if kind is None:
            kind = _kind(e)
        oid = e.originator_id
        self.stamps[oid] = e.timestamp
        if kind == _ITEM_MOVE:
            to = e.to_state
            if e.command == "claim":
                ev = e.evidence or {}
                self._items[oid] = _ItemNow(
                    to, ev.get("lease_token"), e.actor_id, ev.get("expires_at")
                )
            else:
                self._items[oid] = _ItemNow(to, None, None, None)
            counts = self._counts.get(e.run_id)
            if counts is None:
                counts = self._counts[e.run_id] = {}
            frm = e.from_state
            counts[frm] = counts.get(frm, 0) - 1
            counts[to] = counts.get(to, 0) + 1
            self._moved[oid] = (e.run_id, e.item_id, to)
        elif kind == _RUN_MOVE:
            self._states[run_of(e)] = e.to_state
            if e.command == "weaken_acceptance":
                self._amenders.add((run_of(e), e.actor_id))
        elif kind == _AMEND:
            self._amenders.add((run_of(e), e.actor_id))
        elif kind == _SUBMITTED:
            self._states[run_of(e)] = S.QUEUED
        elif kind == _LEASE:
            item = self._items.get(oid)
            if item is not None:
                self._items[oid] = _ItemNow(
                    item.state, item.lease_token, item.lease_worker, e.expires_at
                )


def check_batch(events: Iterable[Any], facts: Overlay) -> None:
    """Raise InvariantViolated at the first event of the batch that breaks a rule;
    otherwise take every event into `facts`."""
    for e in events:
        at = At(e, facts)
        for rule in _BY_KIND[at.kind]:
            detail = rule.check(e, facts, at)
            if detail is not None:
                raise _violation(rule, e, at, detail).error()
        facts.advance(e, at.kind)


__all__ = [
    "RULES",
    "RULE_NAMES",
    "Facts",
    "ItemFacts",
    "Overlay",
    "Rule",
    "Violation",
    "check_batch",
    "check_event",
    "describe",
    "run_of",
]
