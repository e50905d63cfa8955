"""The ledger's typed errors. Every refusal is one of these, and nothing is written."""

from __future__ import annotations

from collections.abc import Iterable

from ledger.core.redact import redact, truncate_bytes

# Error text echoes the caller's input (ids, names): bounded, and secret-looking values
# (DSN passwords, bearer tokens, key=value secrets) redacted before anyone sees it.
MAX_MESSAGE_BYTES = 4096


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""

    def __init__(self, message: str) -> None:
        # cut before redacting too, so a huge message costs bounded time
        message = truncate_bytes(
            redact(truncate_bytes(str(message), 2 * MAX_MESSAGE_BYTES)), MAX_MESSAGE_BYTES
        )
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description, used by the CLI and the HTTP API."""
        return {"error": type(self).__name__, "message": self.message}


class InvalidInput(LedgerError):
    """An argument is malformed; the message names it and what is allowed."""


class ManifestInvalid(InvalidInput):
    """A manifest failed validation; `field` is the path of the first bad field."""

    def __init__(
        self, message: str, field: str = "", errors: list[dict[str, object]] | None = None
    ):
        super().__init__(message)
        self.field = field
        self.errors = errors or []


class RunNotFound(LedgerError):
    """No run has this id."""

    def __init__(self, run_id: str, message: str | None = None) -> None:
        super().__init__(message or f"run {run_id!r} does not exist")
        self.run_id = run_id


class ItemNotFound(LedgerError):
    """The run has no item with this id."""

    def __init__(self, run_id: str, item_id: str) -> None:
        super().__init__(f"run {run_id!r} has no item {item_id!r}")
        self.run_id = run_id
        self.item_id = item_id


class NotAuthorized(LedgerError):
    """This role may never make this command."""


class Conflict(LedgerError):
    """The caller's expected revision is stale; re-read and decide again."""

    def __init__(self, message: str, current_revision: int, current_state: str) -> None:
        super().__init__(message)
        self.current_revision = current_revision
        self.current_state = current_state

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d.update(current_revision=self.current_revision, current_state=self.current_state)
        return d


class IllegalTransition(LedgerError):
    """The command is not allowed from the current state."""

    def __init__(self, message: str, state: str, allowed: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.state = state
        self.allowed = sorted(allowed)

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d.update(state=self.state, allowed=self.allowed)
        return d


class AlreadyTerminal(IllegalTransition):
    """The run is terminal; corrections start a new linked run instead."""


class NotComplete(IllegalTransition):
    """`complete` found work that blocks success; the message names it."""


class RunArchived(IllegalTransition):
    """The run's events are in an archive (ledger/transfer/archive.py): a command that needs them
    (retry, repair, compensate) is refused until `restore` brings them back."""

    def __init__(self, message: str, state: str, archive: str) -> None:
        super().__init__(message, state)
        self.archive = archive

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d.update(archive=self.archive)
        return d


class LeaseLost(LedgerError):
    """The lease expired, was fenced or was taken over; the worker must stop writing."""


class StaleReview(LedgerError):
    """A review decision named an input version that is not the one under review."""

    def __init__(self, message: str, expected_version: str) -> None:
        super().__init__(message)
        self.expected_version = expected_version

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d.update(expected_version=self.expected_version)
        return d


class StoreUnavailable(LedgerError):
    """The database could not be reached, dropped the connection before the command
    committed, or rolled the transaction back itself (a lock or statement timeout, a
    deadlock, a full disk: the message names which, with its SQLSTATE): nothing was
    written, and repeating the command is safe. Commands retry this themselves for a
    while before raising it."""


class CommitUncertain(LedgerError):
    """The connection dropped while the command committed: it may or may not have been
    applied. Re-read before deciding, or repeat the command with the same
    `idempotency_key` (a keyed command is repeated by the ledger itself)."""


class InvariantViolated(LedgerError):
    """An event breaks a rule of the rule checker (`ledger/core/rule_check.py`): a command
    would have written what `verify` rejects, or a history file being imported, restored
    or copied holds such an event. Nothing was written. `kind` names the rule, `run_id`
    the run, `stream` and `version` the event (`position` its position in a file)."""

    def __init__(
        self,
        message: str,
        kind: str,
        run_id: str | None = None,
        stream: str | None = None,
        version: int | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.run_id = run_id
        self.stream = stream
        self.version = version
        self.position = position

    def to_dict(self) -> dict[str, object]:
        return {
            **super().to_dict(),
            "kind": self.kind,
            "run_id": self.run_id,
            "stream": self.stream,
            "version": self.version,
            "position": self.position,
        }


class FollowerNotFound(LedgerError):
    """No follower checkpoint has this name (see `ledger followers`)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no follower is named {name!r}; `ledger followers` lists them")
        self.name = name


class WebhookNotFound(LedgerError):
    """No webhook has this id (see `ledger webhooks list`)."""

    def __init__(self, webhook_id: str) -> None:
        super().__init__(f"no webhook has the id {webhook_id!r}; `ledger webhooks list` lists them")
        self.webhook_id = webhook_id


class FollowerBusy(LedgerError):
    """Another process is running the follower of this name: one name delivers at a time."""


__all__ = [
    "AlreadyTerminal",
    "CommitUncertain",
    "Conflict",
    "FollowerBusy",
    "FollowerNotFound",
    "IllegalTransition",
    "InvalidInput",
    "InvariantViolated",
    "ItemNotFound",
    "LeaseLost",
    "LedgerError",
    "ManifestInvalid",
    "NotAuthorized",
    "NotComplete",
    "RunNotFound",
    "StaleReview",
    "StoreUnavailable",
    "WebhookNotFound",
]
