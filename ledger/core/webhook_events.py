"""The events of a webhook's stream: who registered, changed and removed it, when and why.

A webhook is no run: its changes are events of a stream of its own (`webhook_stream_id`,
a UUID5 of its id), appended in the transaction of the command that makes the change,
hash-chained like every other stream (ledger/stores/hashchain.py) and leaves of the
Merkle tree. Each carries the operator, role and reason, and what the webhook is after
the change: its URL, the run and kinds it delivers, its URL policy and the fingerprint
of its signing secret, never the secret (that stays in `lg_webhooks`, encrypted).

`lg_webhook_changes` holds one row per event (its `position`), written by the projector
from the event (`change_row`); `verify` compares each row with its event. The change
feed reads transitions of runs and items (`lg_transitions`), so followers and webhooks
never see these events; `audit` shows them beside the transitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import DomainEvent
from eventsourcing.utils import register_topic

from ledger.core import states as S
from ledger.core.rows import iso

# the namespace of webhook stream ids (fixed: a webhook's stream id never changes)
WEBHOOK_NAMESPACE = UUID("6b1d2a4e-58c1-5f0e-9a57-7e0b3c2d9f41")
TOPIC_MODULE = "ledger.webhooks"

# the webhook's lifecycle as its events record it (audit's from and to states)
REGISTERED = "registered"
REMOVED = "removed"
COMMANDS = ("add", "change", "rotate", "remove", "rekey")
ROLES = (S.OPERATOR,)  # who may add, change and remove webhooks


def states_of(command: str) -> tuple[str, str]:
    """The webhook's state before and after a command (`-`: it did not exist), as audit
    shows them."""
    if command == "add":
        return "-", REGISTERED
    return REGISTERED, REMOVED if command == "remove" else REGISTERED


def webhook_stream_id(webhook_id: str) -> UUID:
    """The event stream of one webhook."""
    return uuid5(WEBHOOK_NAMESPACE, "webhook:" + webhook_id)


@dataclass(frozen=True)
class WebhookEvent(DomainEvent):
    """A command on a webhook, and the webhook as it was after it (`command`: add,
    change, rotate, remove, rekey). `run_filter` and `kinds` are what it delivers."""

    webhook_id: str
    command: str
    actor_id: str
    role: str
    reason: str
    url: str
    run_filter: str | None
    kinds: list[str]
    allow_http: bool
    allow_host: str | None
    secret_fingerprint: str | None

    @property
    def from_state(self) -> str:
        return states_of(self.command)[0]

    @property
    def to_state(self) -> str:
        return states_of(self.command)[1]


@dataclass(frozen=True)
class WebhookRegistered(WebhookEvent):
    """A webhook was registered (`add`)."""


@dataclass(frozen=True)
class WebhookChanged(WebhookEvent):
    """A webhook's URL or policy changed (`change`), it got a new signing secret
    (`rotate`), or its secret was encrypted again with another key (`rekey`)."""


@dataclass(frozen=True)
class WebhookRemoved(WebhookEvent):
    """A webhook was removed (`remove`): nothing more is delivered to it."""


EVENT_OF_COMMAND: dict[str, type[WebhookEvent]] = {
    "add": WebhookRegistered,
    "change": WebhookChanged,
    "rotate": WebhookChanged,
    "rekey": WebhookChanged,
    "remove": WebhookRemoved,
}

for _cls in (WebhookRegistered, WebhookChanged, WebhookRemoved):
    _topic = f"{TOPIC_MODULE}:{_cls.__qualname__}"
    setattr(_cls, "TOPIC", _topic)  # noqa: B010 (eventsourcing's construct_topic reads it)
    register_topic(_topic, _cls)


# the columns of lg_webhook_changes an event gives, in the order `change_row` returns them
ROW_COLUMNS = (
    "webhook_id",
    "command",
    "actor_id",
    "role",
    "reason",
    "at",
    "url",
    "run_id",
    "kinds",
    "allow_http",
    "allow_host",
    "secret_fingerprint",
    "position",
)


def change_row(position: int, e: WebhookEvent) -> tuple[Any, ...]:
    """The lg_webhook_changes values (ROW_COLUMNS) of one webhook event at `position`."""
    return (
        e.webhook_id,
        e.command,
        e.actor_id,
        e.role,
        e.reason,
        iso(e.timestamp),
        e.url,
        e.run_filter,
        json.dumps(e.kinds) if e.kinds else None,
        int(bool(e.allow_http)),
        e.allow_host,
        e.secret_fingerprint,
        position,
    )


def row_values(row: dict[str, Any]) -> tuple[Any, ...]:
    """A stored lg_webhook_changes row's values in ROW_COLUMNS order (as `change_row`
    makes them: compare the two to see whether a row says what its event says)."""
    out = []
    for column in ROW_COLUMNS:
        value = row.get(column)
        if column in ("allow_http", "position") and value is not None:
            value = int(value)
        out.append(value)
    return tuple(out)


__all__ = [
    "COMMANDS",
    "EVENT_OF_COMMAND",
    "REGISTERED",
    "REMOVED",
    "ROLES",
    "ROW_COLUMNS",
    "WebhookChanged",
    "WebhookEvent",
    "WebhookRegistered",
    "WebhookRemoved",
    "change_row",
    "row_values",
    "states_of",
    "webhook_stream_id",
]
