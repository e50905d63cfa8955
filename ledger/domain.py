"""Run and Item aggregates and their events (eventsourcing).

A run's stream holds the run's own events; each item has its own stream, created
lazily on the item's first transition, so claims on different items never
contend on one stream. Every transition event carries the run id, the item id
where relevant, the previous and new state, the actor and role, the reason, the
evidence and the time.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate

from . import states as S

SUMMARY_MAX_BYTES = 1024


def run_stream_id(run_id: str) -> UUID:
    """The run's stream id is its run id."""
    return UUID(run_id)


def item_stream_id(run_id: str, item_id: str) -> UUID:
    """Item streams have deterministic ids, so any process can address them."""
    return uuid.uuid5(UUID(run_id), item_id)


def bounded_summary(text: str | None, limit: int = SUMMARY_MAX_BYTES) -> str:
    """Cut to at most `limit` UTF-8 bytes without splitting a character."""
    text = text or ""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "..."


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
            self.review = {
                "decision": ev["decision"],
                "input_version": ev["input_version"],
                "approved_version": (self.review or {}).get("approved_version"),
                "requested_at": e.timestamp.isoformat(),
            }
            if ev.get("reviewer"):
                self.review["reviewer"] = ev["reviewer"]
        elif e.command == "decide" and self.review is not None:
            self.review = dict(self.review)
            self.review["decided_by"] = e.actor_id
            if ev.get("approve"):
                self.review["approved_version"] = ev["input_version"]
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
        """Record one run transition."""
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
        """Record a new input version."""
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


class Item(Aggregate):
    """What happened to one unit of a run: its state, attempts and current lease."""

    class Registered(Aggregate.Created):
        """The item's stream begins (lazily, with its first transition)."""

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
            item.lease_expires_at = self.expires_at

    def __init__(self, run_id: str, item_id: str) -> None:
        self.run_id = run_id
        self.item_id = item_id
        self.state = S.PENDING
        self.attempts = 0
        self.lease_token: str | None = None
        self.lease_worker: str | None = None
        self.lease_expires_at: str | None = None
        self.eligible_at: str | None = None
        self.last_error: str | None = None
        self.reason: str | None = None

    def on_transition(self, e: Transitioned) -> None:
        ev = e.evidence
        self.state = e.to_state
        self.reason = e.reason
        if e.command == "claim":
            self.attempts = ev["attempt"]
            self.lease_token = ev["lease_token"]
            self.lease_worker = e.actor_id
            self.lease_expires_at = ev["expires_at"]
            return
        if e.from_state == S.IN_PROGRESS:
            # an attempt ended: drop the lease (the attempts projection records the outcome)
            self.lease_token = None
            self.lease_worker = None
            self.lease_expires_at = None
        if ev.get("error") is not None:
            self.last_error = ev["error"]
        if e.to_state == S.RETRYABLE:
            self.eligible_at = ev.get("eligible_at")

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
        """Record one item transition."""
        self.trigger_event(
            self.Transitioned,
            run_id=self.run_id,
            item_id=self.item_id,
            command=command,
            from_state=self.state,
            to_state=to_state,
            actor_id=actor_id,
            role=role,
            reason=reason,
            evidence=evidence,
            timestamp=at,
        )

    def extend_lease(self, expires_at: str, actor_id: str, at: datetime) -> None:
        """Record a heartbeat."""
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
