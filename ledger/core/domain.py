"""Run and Item aggregates and their events (eventsourcing).

A run's stream holds the run's own events; each item has its own stream, created
lazily on the item's first transition, so claims on different items never
contend on one stream. Every transition event carries the run id, the item id
where relevant, the previous and new state, the actor and role, the reason, the
evidence and the time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from datetime import datetime
from typing import Any, ClassVar, NamedTuple, NoReturn, Protocol
from uuid import UUID

from eventsourcing.domain import Aggregate, DomainEvent
from eventsourcing.utils import register_topic

from ledger.core import states as S
from ledger.core.errors import AlreadyTerminal, IllegalTransition, InvalidInput

SUMMARY_MAX_BYTES = 1024


def run_stream_id(run_id: str) -> UUID:
    """The run's stream id is its run id."""
    return UUID(run_id)


@functools.lru_cache(maxsize=16384)
def item_stream_id(run_id: str, item_id: str) -> UUID:
    """Item streams have deterministic ids, so any process can address them: uuid5 of
    the item id in the run id's namespace (`uuid.uuid5`'s very value, computed from the
    run's namespace bytes parsed once per run and the digest as an integer: a replay
    begins every item's stream here, and `uuid.uuid5` parsed the run id each time).
    Kept for the items used last: a claim begins an item's stream and the outcome that
    follows reads it twice (its row's aggregate, the stream head its event chains to);
    a hit costs 0.1 us against 1.5 us, a miss no more than the computation on the bench
    machine."""
    digest = hashlib.sha1(_namespace(run_id) + item_id.encode("utf-8")).digest()  # noqa: S324 (uuid5 is SHA-1 by definition)
    value = int.from_bytes(digest[:16], "big")
    return UUID(int=(value & _UUID5_CLEAR) | _UUID5_SET)


_UUID5_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)  # version, variant bits
_UUID5_SET = (5 << 76) | (0x8000 << 48)  # version 5, RFC 4122 variant


@functools.lru_cache(maxsize=4096)
def _namespace(run_id: str) -> bytes:
    return UUID(run_id).bytes


def bounded_summary(text: str | None, limit: int = SUMMARY_MAX_BYTES) -> str:
    """Cut to at most `limit` UTF-8 bytes without splitting a character."""
    text = text or ""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "..."


# --------------------------------------------------------------------------
# the rule book's guards: every transition method below calls them, so no event the
# table does not allow is ever triggered (the handlers call them first too, to refuse
# in the rule book's order of checks before they do any other work)
# --------------------------------------------------------------------------
def refuse_run_state(run_id: str, state: str, rule: S.Rule, command: str | None = None) -> NoReturn:
    """AlreadyTerminal (terminal run) or IllegalTransition, naming the state and the allowed set."""
    name = command or rule.command
    if S.is_terminal(state):
        raise AlreadyTerminal(
            f"run {run_id} is {state}, which is terminal; {name} is allowed from: "
            f"{rule.allowed()}. Corrections start a new linked run (retry, repair, compensate)",
            state=state,
            allowed=rule.sources,
        )
    raise IllegalTransition(
        f"run {run_id} is {state}; {name} is allowed from: {rule.allowed()}",
        state=state,
        allowed=rule.sources,
    )


def check_run_state(run_id: str, state: str, rule: S.Rule) -> None:
    """The run may make `rule`'s move from `state`."""
    if state not in rule.sources:
        refuse_run_state(run_id, state, rule)


def check_item_run_state(run_id: str, run_state: str, rule: S.Rule) -> None:
    """An item command needs its run in one of `rule.run_states` (rule 12 of the rule book: no item of
    a terminal run changes; claims need a running run)."""
    if not rule.run_states or run_state in rule.run_states:
        return
    allowed = ", ".join(sorted(rule.run_states))
    if S.is_terminal(run_state):
        raise AlreadyTerminal(
            f"run {run_id} is {run_state}, which is terminal; its items never change",
            state=run_state,
            allowed=rule.run_states,
        )
    what = (
        "items are claimed only while it is running"
        if rule.command == "claim"
        else (f"{rule.command} of an item needs the run {allowed}")
    )
    raise IllegalTransition(
        f"run {run_id} is {run_state}; {what}", state=run_state, allowed=rule.run_states
    )


def check_item_state(run_id: str, item_id: str, state: str, rule: S.Rule) -> None:
    """The item may make `rule`'s move from `state`."""
    if state not in rule.sources:
        raise IllegalTransition(
            f"item {item_id!r} of run {run_id} is {state}; {rule.command} is allowed from: "
            f"{rule.allowed()}",
            state=state,
            allowed=rule.sources,
        )


def check_target(rule: S.Rule, from_state: str, to_state: str) -> None:
    """The target is one of the rule's (a rule without targets keeps the state)."""
    if to_state not in (rule.targets or (from_state,)):
        raise IllegalTransition(
            f"{rule.command} leads to {', '.join(rule.targets) or from_state}, not {to_state}",
            state=from_state,
            allowed=rule.sources,
        )


def check_evidence(rule: S.Rule, evidence: dict[str, Any]) -> None:
    """The evidence carries every key the rule's evidence column names, none of them null."""
    missing = [k for k in rule.evidence if evidence.get(k) is None]
    if missing:
        raise InvalidInput(f"{rule.command} needs evidence {', '.join(missing)}")


class Run(Aggregate):
    """Why a set of items is processed, under which settings, and where it stands."""

    class Submitted(Aggregate.Created):
        """A new run: submit, retry, repair or compensate."""

        run_id: str
        command: str
        manifest: dict[str, Any]
        input_version: str
        actor_id: str
        role: str
        reason: str | None
        links: list[dict[str, str]]
        root_run_id: str
        # the W3C traceparent of the span that created the run, when it was traced: set on
        # the event's state only then (`with_traceparent`), so untraced events and the
        # events stored before traces keep their exact shape
        traceparent: ClassVar[str | None] = None

        def apply(self, run: Run) -> None:
            run.on_submitted(self)

    class Transitioned(Aggregate.Event):
        """The run moved from one state to another (or was amended in place)."""

        command: str
        from_state: str
        to_state: str
        actor_id: str
        role: str
        reason: str | None
        evidence: dict[str, Any]

        def apply(self, run: Run) -> None:
            run.on_transition(self)

    class Amended(Aggregate.Event):
        """Items added, replaced or withdrawn, or policy changed: a new input version."""

        actor_id: str
        role: str
        reason: str | None
        added: list[dict[str, Any]]
        replaced: list[dict[str, Any]]
        withdraw: list[str]
        policy: dict[str, Any] | None
        input_version: str
        state: str

        def apply(self, run: Run) -> None:
            run.on_amended(self)

    def __init__(
        self,
        run_id: str,
        manifest: dict[str, Any],
        input_version: str,
        actor_id: str,
        links: list[dict[str, str]],
        root_run_id: str,
    ) -> None:
        self.run_id = run_id
        self.state = S.QUEUED
        self.source_version: str = manifest["source_version"]
        self.config_version: str = manifest["config_version"]
        self.scope: str = manifest.get("scope", "")
        self.policy: dict[str, Any] = manifest["policy"]
        self.input_version = input_version
        self.created_by = actor_id
        self.links = list(links)
        self.root_run_id = root_run_id
        self.seq = 0  # position of the creating event, set by the run projection
        self.started_at: datetime | None = None
        self.stopped_at: datetime | None = None
        self.stop_reason: str | None = None
        self.failure_kind: str | None = None
        self.failure_reason: str | None = None
        self.summary = ""
        self.review: dict[str, Any] | None = None
        self.cancel_requested = False
        # Items per state. Item events live in item streams; the run projection keeps
        # these counts current (they are derived, not part of the run's own events).
        self.counts: dict[str, int] = {s: 0 for s in S.ITEM_STATES}
        self.item_count = len(manifest.get("items", ()))
        self.counts[S.PENDING] = self.item_count

    # -- appliers ---------------------------------------------------------
    def on_submitted(self, e: Submitted) -> None:
        self.summary = bounded_summary(e.reason) if e.reason else ""

    def on_transition(self, e: Transitioned) -> None:
        self.state = e.to_state
        # the summary comes from the latest transition's reason ("run <state>" when it has none)
        self.summary = bounded_summary(e.reason) if e.reason else ""
        ev = e.evidence
        if e.command == "start":
            self.started_at = e.timestamp
        elif e.command == "request_review":
            prev = self.review or {}
            self.review = {
                "decision": ev["decision"],
                "input_version": ev["input_version"],
                "approved_version": prev.get("approved_version"),
                "requested_at": e.timestamp.isoformat(),
            }
            if ev.get("reviewer"):
                self.review["reviewer"] = ev["reviewer"]
            if "survives" in prev:
                self.review["survives"] = prev["survives"]
        elif e.command == "decide" and self.review is not None:
            self.review = dict(self.review)
            self.review["decided_by"] = e.actor_id
            if ev.get("approve"):
                self.review["approved_version"] = ev["input_version"]
                if "survives_amendment" in ev:
                    # whether the policy let this approval survive amendments when it was given
                    # (a later change of the policy does not); absent from older approvals
                    self.review["survives"] = bool(ev["survives_amendment"])
        elif e.command in ("cancel", "cancel_finished"):
            self.cancel_requested = True
        if e.to_state == S.FAILED:
            self.failure_kind = ev.get("failure_kind")
            self.failure_reason = ev.get("failure_reason")
        if e.to_state in S.TERMINAL_RUN_STATES:
            self.stopped_at = e.timestamp
            self.stop_reason = e.reason

    def on_amended(self, e: Amended) -> None:
        self.input_version = e.input_version
        self.item_count += len(e.added)
        self.counts[S.PENDING] += len(e.added)
        if e.policy is not None:
            self.policy = e.policy
        review = self.review
        if (
            review is not None
            and review.get("approved_version") is not None
            and "survives" in review
            and (e.added or e.replaced or not review["survives"])
        ):
            # rule 13 of the rule book: an amendment voids the approval unless it survives amendments
            # (as the policy said when it was given) and no payload was added or replaced.
            # Approvals stored without "survives_amendment" have no "survives": left as they are.
            self.review = {**review, "approved_version": None}
        if self.state == S.AWAITING_REVIEW and self.review is not None:
            # the pending review is now bound to the new input version
            self.review = dict(self.review)
            self.review["input_version"] = e.input_version
        if e.reason:
            self.summary = bounded_summary(e.reason)

    # -- commands (validation happens in the service) ----------------------
    def transition(
        self,
        command: str,
        to_state: str,
        actor_id: str,
        role: str,
        reason: str | None,
        evidence: dict[str, Any],
        at: datetime,
    ) -> None:
        """Record one run transition; refused unless the rule book allows it."""
        rule = S.any_run_rule(command)
        check_run_state(self.run_id, self.state, rule)
        check_target(rule, self.state, to_state)
        check_evidence(rule, evidence)
        self.trigger_event(
            self.Transitioned,
            command=command,
            from_state=self.state,
            to_state=to_state,
            actor_id=actor_id,
            role=role,
            reason=reason,
            evidence=evidence,
            timestamp=at,
        )

    def amend(
        self,
        actor_id: str,
        role: str,
        reason: str | None,
        added: list[dict[str, Any]],
        replaced: list[dict[str, Any]],
        withdraw: list[str],
        policy: dict[str, Any] | None,
        input_version: str,
        at: datetime,
    ) -> None:
        """Record a new input version; refused unless the rule book allows an amend."""
        check_run_state(self.run_id, self.state, S.command_rule("amend"))
        self.trigger_event(
            self.Amended,
            actor_id=actor_id,
            role=role,
            reason=reason,
            added=added,
            replaced=replaced,
            withdraw=withdraw,
            policy=policy,
            input_version=input_version,
            state=self.state,
            timestamp=at,
        )


class EndedLease(NamedTuple):
    """The lease of an attempt that ended: what its attempt row holds besides the outcome.
    `started_on` is the holder's own form of the time the lease was granted (a datetime
    on the Item aggregate, the row's text in a replay's fold)."""

    worker_id: str
    lease_token: str
    started_on: Any
    expires_at: str


class ItemFields(Protocol):
    """An item's own fields: the Item aggregate's, and a replay's item row
    (ledger/projections/fold.py). What an item event does to them is written once,
    below, and applied to both, so a rebuild folding stored events into rows and the
    commands' aggregates cannot disagree. `lease_started_on` is when the live lease was
    granted (the open attempt's start), in the holder's own form of a time."""

    state: str
    attempts: int
    lease_token: str | None
    lease_worker: str | None
    lease_expires_at: str | None
    lease_started_on: Any
    eligible_at: str | None
    last_error: str | None
    reason: str | None


# the fields of `ItemFields` whose form is the same on the aggregate, a row and a fold's
# row (`lease_started_on` is a time on the aggregate, its text on a row)
ITEM_FIELDS = (
    "state",
    "attempts",
    "lease_token",
    "lease_worker",
    "lease_expires_at",
    "eligible_at",
    "last_error",
    "reason",
)


def begin_item_fields(item: ItemFields) -> None:
    """An item's fields before its stream's first event: pending, never attempted."""
    item.state = S.PENDING
    item.attempts = 0
    item.lease_token = None
    item.lease_worker = None
    item.lease_expires_at = None
    item.lease_started_on = None
    item.eligible_at = None
    item.last_error = None
    item.reason = None


def apply_item_transition(
    item: ItemFields,
    command: str,
    from_state: str,
    to_state: str,
    actor_id: str,
    reason: str | None,
    evidence: dict[str, Any],
    at: Any,
) -> EndedLease | None:
    """What an item transition (`Item.Transitioned`'s attributes, `at` its time in the
    holder's form) does to the item's fields; the lease of the attempt it ends, if any
    (its attempt row is written from it, once, when it ends)."""
    item.state = to_state
    item.reason = reason
    if command == "claim":
        item.attempts = evidence["attempt"]
        item.lease_token = evidence["lease_token"]
        item.lease_worker = actor_id
        item.lease_expires_at = evidence["expires_at"]
        item.lease_started_on = at
        return None
    ended = None
    if from_state == S.IN_PROGRESS:
        # an attempt ended: drop the lease (its attempt row records the outcome)
        if item.lease_token is not None and item.lease_started_on is not None:
            assert item.lease_worker is not None and item.lease_expires_at is not None
            ended = EndedLease(
                item.lease_worker, item.lease_token, item.lease_started_on, item.lease_expires_at
            )
        item.lease_started_on = None
        item.lease_token = None
        item.lease_worker = None
        item.lease_expires_at = None
    error = evidence.get("error")
    if error is not None:
        item.last_error = error
    if to_state == S.RETRYABLE:
        item.eligible_at = evidence.get("eligible_at")
    return ended


def apply_lease_extension(item: ItemFields, expires_at: str) -> None:
    """What a heartbeat (`Item.LeaseExtended`) does to the item's fields."""
    item.lease_expires_at = expires_at


@functools.cache
def _event_fields(cls: type[DomainEvent]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def next_event(aggregate: Aggregate, cls: type[Aggregate.Event], attrs: dict[str, Any]) -> None:
    """`aggregate.trigger_event(cls, ...)` with the event's attributes given whole, in its
    fields' order (checked), its originator id, next version and time first: the same
    event (the same attributes in the same order, so the same stored bytes), applied and
    pending the same way, built without the frozen dataclass's `__init__` (one
    `object.__setattr__` per field and the library's keyword handling: half of an item
    transition's time on the bench machine). The event is built as the mapper builds
    the events it reads (ledger/stores/encoding.py `to_domain_event`)."""
    if tuple(attrs) != _event_fields(cls):  # (the id and version: `mutate` checks them)
        raise TypeError(f"{cls.__qualname__} is built from its fields in their order")
    event = object.__new__(cls)
    object.__setattr__(event, "__dict__", attrs)
    event.mutate(aggregate)
    aggregate._pending_events.append(event)


class Item(Aggregate):
    """What happened to one unit of a run: its state, attempts and current lease."""

    class Registered(Aggregate.Created):
        """The first event of the item streams written before 2026-12-02 (stored with
        the item's first transition). An item's stream now begins with that transition,
        at version 1 (`Item.begin`): the run's `Submitted` already declares the item
        (one event and one hash row less per item). Kept so that the
        histories written before read back."""

        run_id: str
        item_id: str

    class Transitioned(Aggregate.Event):
        """The item moved from one state to another."""

        run_id: str
        item_id: str
        command: str
        from_state: str
        to_state: str
        actor_id: str
        role: str
        reason: str | None
        evidence: dict[str, Any]

        def apply(self, item: Item) -> None:
            item.on_transition(self)

    class LeaseExtended(Aggregate.Event):
        """A heartbeat from the lease holder moved the lease's expiry."""

        run_id: str
        item_id: str
        token: str
        expires_at: str
        actor_id: str

        def apply(self, item: Item) -> None:
            apply_lease_extension(item, self.expires_at)

    @classmethod
    def begin(cls, run_id: str, item_id: str, at: datetime) -> Item:
        """The item before its stream's first event (version 0, nothing stored): a
        declared item's first transition is its stream's first event. A replay meets
        such a stream's version 1 with no aggregate and begins it here too."""
        item = cls.__new__(cls)
        item.__base_init__(
            originator_id=item_stream_id(run_id, item_id), originator_version=0, timestamp=at
        )
        item.__init__(run_id, item_id)  # type: ignore[misc]
        return item

    def __init__(self, run_id: str, item_id: str) -> None:
        self.run_id = run_id
        self.item_id = item_id
        self.state: str
        self.attempts: int
        self.lease_token: str | None
        self.lease_worker: str | None
        self.lease_expires_at: str | None
        self.lease_started_on: datetime | None
        self.eligible_at: str | None
        self.last_error: str | None
        self.reason: str | None
        begin_item_fields(self)
        # the leases of the attempts that ended since this aggregate was made, by attempt
        # number: each attempt's row is written once, when it ends, from its lease (not
        # stored; a replay projects several events of one item together)
        self.ended_leases: dict[int, EndedLease] = {}

    def on_transition(self, e: Transitioned) -> None:
        ended = apply_item_transition(
            self, e.command, e.from_state, e.to_state, e.actor_id, e.reason, e.evidence, e.timestamp
        )
        if ended is not None:
            self.ended_leases[self.attempts] = ended

    def transition(
        self,
        command: str,
        to_state: str,
        actor_id: str,
        role: str,
        reason: str | None,
        evidence: dict[str, Any],
        at: datetime,
        run_state: str,
    ) -> None:
        """Record one item transition of a run in `run_state`; refused unless the rule book
        allows it (the item's state, the run's state, the target and the evidence)."""
        rule = S.item_rule(command)
        check_item_run_state(self.run_id, run_state, rule)
        check_item_state(self.run_id, self.item_id, self.state, rule)
        check_target(rule, self.state, to_state)
        check_evidence(rule, evidence)
        next_event(
            self,
            self.Transitioned,
            {
                "originator_id": self.id,
                "originator_version": self.version + 1,
                "timestamp": at,
                "run_id": self.run_id,
                "item_id": self.item_id,
                "command": command,
                "from_state": self.state,
                "to_state": to_state,
                "actor_id": actor_id,
                "role": role,
                "reason": reason,
                "evidence": evidence,
            },
        )

    def extend_lease(self, expires_at: str, actor_id: str, at: datetime, run_state: str) -> None:
        """Record a heartbeat of a run in `run_state` (the table's heartbeat row)."""
        rule = S.item_rule("heartbeat")
        check_item_run_state(self.run_id, run_state, rule)
        check_item_state(self.run_id, self.item_id, self.state, rule)
        assert self.lease_token is not None
        self.trigger_event(
            self.LeaseExtended,
            run_id=self.run_id,
            item_id=self.item_id,
            token=self.lease_token,
            expires_at=expires_at,
            actor_id=actor_id,
            timestamp=at,
        )


# A stored event names its class by topic ("module:qualname"). The topics stay the ones
# the first release wrote, when this module was `ledger.domain`: the histories already
# stored resolve, and new events keep the topic (and so the bytes) they always had.
STORED_MODULE = "ledger.domain"


def _pin_topics() -> None:
    for aggregate in (Run, Item):
        events = [
            v
            for v in vars(aggregate).values()
            if isinstance(v, type) and issubclass(v, DomainEvent)
        ]
        for cls in (aggregate, *events):
            topic = f"{STORED_MODULE}:{cls.__qualname__}"
            setattr(cls, "TOPIC", topic)  # noqa: B010 (eventsourcing's construct_topic reads it)
            register_topic(topic, cls)


_pin_topics()
