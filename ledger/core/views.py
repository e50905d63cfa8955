"""Values the ledger returns: accepted state, never a worker's memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger.core.recorded import decode_recorded


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class _View:
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO 8601)."""
        out = _jsonable(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True)
class Actor(_View):
    """Who makes a command: an id and one of the ledger's roles."""

    id: str
    role: str

    @classmethod
    def parse(cls, text: str) -> Actor:
        """Parse `ID:ROLE`."""
        ident, sep, role = text.rpartition(":")
        if not sep or not ident:
            from ledger.core.errors import InvalidInput

            raise InvalidInput(f"actor must look like ID:ROLE, got {text!r}")
        return cls(ident, role)


@dataclass(frozen=True)
class Link(_View):
    """A relation between runs: retry_of, repair_of, correction_of, compensates, and reverses."""

    relation: str
    run_id: str


@dataclass(frozen=True)
class NotAcceptedItem(_View):
    """A required or optional item that did not end accepted, and why."""

    item_id: str
    state: str
    required: bool
    reason: str | None


@dataclass(frozen=True)
class RunStatus(_View):
    """A run as the store accepted it."""

    run_id: str
    state: str
    revision: int
    failure_kind: str | None
    failure_reason: str | None
    input_version: str
    counts: dict[str, int]
    summary: str
    not_accepted: list[NotAcceptedItem]
    waiting_on: str
    links: list[Link]
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    source_version: str = ""
    config_version: str = ""
    scope: str = ""
    created_by: str = ""
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    stop_reason: str | None = None
    review: dict[str, Any] | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    root_run_id: str = ""
    # Who owns the delay, precisely (rule 19 of the rule book; ledger/reads/signals.py): the person where
    # known, since when, the latest run or item transition, stalled, items finished per
    # minute over the last 5 minutes, the estimated end, leases expired but unreconciled.
    waiting_on_actors: list[str] = field(default_factory=list)
    waiting_since: datetime | None = None
    last_activity_at: datetime | None = None
    stalled: bool = False
    rate: float = 0.0
    eta: datetime | None = None
    expired_leases: int = 0
    # `links` holds at most MAX_STATUS_LINKS (the first recorded); this is how many there are
    links_total: int = 0


# A status stays a bounded summary however many runs link to this one (retries, repairs,
# compensations): the first links recorded, and their total; `lineage` lists them all.
MAX_STATUS_LINKS = 20


@dataclass(frozen=True)
class Lease(_View):
    """The right to work on one item until `expires_at`; outcomes need its token."""

    run_id: str
    item_id: str
    token: str
    worker_id: str
    attempt: int
    expires_at: datetime
    payload: Any = None


@dataclass(frozen=True)
class ItemStatus(_View):
    """An item as the store accepted it."""

    run_id: str
    item_id: str
    state: str
    required: bool
    attempts: int
    lease: Lease | None
    last_error: str | None
    revision: int
    reason: str | None = None
    payload: Any = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class Attempt(_View):
    """One try of one item; its own record, never overwritten once finished."""

    run_id: str
    item_id: str
    attempt: int
    worker_id: str
    lease_token: str
    started_at: datetime
    expires_at: datetime
    finished_at: datetime | None
    stage: str | None
    outcome: str | None
    error: str | None


@dataclass(frozen=True)
class Transition(_View):
    """One state change of a run or an item, as recorded by its event."""

    run_id: str
    item_id: str | None
    from_state: str
    to_state: str
    actor_id: str
    role: str
    reason: str | None
    evidence: dict[str, Any]
    at: datetime
    revision: int
    position: int
    command: str = ""
    payload: Any = None
    """The item's payload as it stood at this transition (its manifest's, after the run's
    amendments before it, none after), when asked for (`events(..., payloads=True)`,
    `Follower(..., payloads=True)`); None when not asked for, on a run's transitions,
    and for an item whose run's events were archived. `to_dict()` leaves it out when
    None, so a feed read without payloads reads as before."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (datetimes as ISO 8601), without `payload` when it is None."""
        out = super().to_dict()
        if out.get("payload") is None:
            del out["payload"]
        return out


class _Decoded:
    """A field of a value built from stored text and decoded on first read (the change
    feed hands a page of transitions to a handler that may never look at `evidence` or
    `at`: `ledger/reads/feed.py` stores the raw text under `raw`, this descriptor decodes it
    once and keeps the result as the field). A non-data descriptor, like
    `functools.cached_property`: a value built by its constructor (or unpickled) has the
    field in its `__dict__` and never calls it, so both kinds are the same type and
    compare, print, pickle and dump alike."""

    __slots__ = ("decode", "name", "raw")

    def __init__(self, name: str, decode: Callable[[str], Any]) -> None:
        self.name = name
        self.raw = "_raw_" + name
        self.decode = decode

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            raise AttributeError(self.name)  # no class-level default
        d = obj.__dict__
        try:
            raw = d[self.raw]
        except KeyError:  # another thread decoded it meanwhile (it stores before it pops)
            return d[self.name]
        value = d.setdefault(self.name, self.decode(raw))
        d.pop(self.raw, None)
        return value


def _transition_state(self: Transition) -> dict[str, Any]:
    """Pickle and copy state: every field decoded, as a value built field by field."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


Transition.__getstate__ = _transition_state  # type: ignore[method-assign,assignment]


class _Recorded:
    """`reason` or `evidence` of a transition built from its stored event, (topic, state
    bytes) under `_raw_event`: both are decoded from the event's state on the first read
    of either (`ledger/core/recorded.py`), as `_Decoded` does for one field."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            raise AttributeError(self.name)  # no class-level default
        d = obj.__dict__
        try:
            raw = d["_raw_event"]
        except KeyError:  # another thread decoded it meanwhile (it stores before it pops)
            return d[self.name]
        reason, evidence = decode_recorded(raw)
        d.setdefault("reason", reason)
        d.setdefault("evidence", evidence)
        d.pop("_raw_event", None)
        return d[self.name]


Transition.reason = _Recorded("reason")  # type: ignore[assignment]
Transition.evidence = _Recorded("evidence")  # type: ignore[assignment]
Transition.at = _Decoded("at", datetime.fromisoformat)  # type: ignore[assignment]


@dataclass(frozen=True)
class CancelOutcome(_View):
    """What `cancel` recorded: the intent, the live leases then, and whether it existed."""

    run_id: str
    state: str
    in_flight: int
    already: bool


@dataclass(frozen=True)
class ReconcileReport(_View):
    """What one reconcile pass did."""

    expired_leases: int = 0
    finished_cancels: int = 0
    finished_pauses: int = 0
    failed_runs: int = 0


@dataclass(frozen=True)
class VerifyReport(_View):
    """The result of replaying every event: `ok` and the problems found."""

    ok: bool
    problems: list[dict[str, Any]]
    events: int = 0
    heads: str = ""
    # runs whose events went to an archive (ledger/transfer/archive.py): where, how many, when
    archived: list[dict[str, Any]] = field(default_factory=list)
