"""Argument checks, the first step of the rule book's order of checks: nothing is read yet.

Each returns the checked value (parsed where a string form is accepted) or raises
`InvalidInput`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, overload

from ledger.core import states as S
from ledger.core.errors import InvalidInput
from ledger.core.redact import MAX_REASON_BYTES, clean_reason, redact_evidence
from ledger.core.validation import MAX_EVIDENCE_BYTES, check_identifier, check_unicode, plain_json
from ledger.core.views import Actor, Lease

_REASON_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Outcome:
    """One outcome for `Ledger.record`: kind is accept, reject or fail."""

    lease: Lease
    kind: str
    evidence: dict[str, Any] | None = None
    stage: str | None = None
    rule: str | None = None
    detail: str | None = None
    error: str | None = None
    retryable: bool = True


def actor(value: Any, what: str = "actor") -> Actor:
    """An `Actor(id, role)` (or its `id:role` text) with a known role."""
    if isinstance(value, str):
        value = Actor.parse(value)
    if not isinstance(value, Actor):
        raise InvalidInput(f"{what} must be an Actor(id, role), got {type(value).__name__}")
    ident = check_identifier(value.id, f"{what}.id")
    if value.role not in S.ROLES:
        raise InvalidInput(
            f"{what}.role {value.role!r} is not a role; roles are: {', '.join(S.ROLES)}"
        )
    # the id as the ledger keeps it (NFC), so lookalike spellings are one actor
    return value if ident == value.id else Actor(ident, value.role)


@overload
def reason(value: Any, what: str = ..., *, required: Literal[True]) -> str: ...
@overload
def reason(value: Any, what: str = ..., required: bool = ...) -> str | None: ...
def reason(value: Any, what: str = "reason", required: bool = False) -> str | None:
    """Free text of at most MAX_REASON_BYTES, without control characters but newline and tab."""
    if value is None:
        if required:
            raise InvalidInput(f"{what} is required")
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    check_unicode(value, what)
    if required and not value.strip():
        raise InvalidInput(f"{what} must not be empty")
    if len(value.encode()) > MAX_REASON_BYTES:
        raise InvalidInput(
            f"{what} is {len(value.encode())} bytes; at most {MAX_REASON_BYTES} allowed"
        )
    if _REASON_CONTROL.search(value):
        raise InvalidInput(
            f"{what} must not contain control characters (newline and tab are allowed)"
        )
    return clean_reason(value)


def stated_reason(value: Any, command: str) -> str:
    """The reason a command of `states.REASON_REQUIRED` must carry: missing or blank is
    refused, naming the command (the ledger records why with its transition)."""
    assert S.needs_reason(command), command
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InvalidInput(
            f"reason is required and must not be empty: {command} is a decision the history "
            "must explain, and the ledger records the caller's reason with its transition"
        )
    return reason(value, required=True)


def revision(expected: Any) -> int | None:
    """`expected_revision`: None or a non-negative integer."""
    if expected is None:
        return None
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise InvalidInput(
            f"expected_revision must be a non-negative integer or None, got {expected!r}"
        )
    return expected


def run_id(value: Any) -> str:
    """A run id (existence is checked later, against the store)."""
    return check_identifier(value, "run_id")


def item_id(value: Any) -> str:
    """An item id."""
    return check_identifier(value, "item_id")


def lease(value: Any) -> Lease:
    """A `Lease` as `claim` returned it (or its dict form)."""
    if isinstance(value, dict):
        try:
            exp = value["expires_at"]
            value = Lease(
                run_id=value["run_id"],
                item_id=value["item_id"],
                token=value["token"],
                worker_id=value["worker_id"],
                attempt=value["attempt"],
                expires_at=exp if isinstance(exp, datetime) else datetime.fromisoformat(exp),
                payload=value.get("payload"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(
                f"lease must have run_id, item_id, token, worker_id, attempt, expires_at: {e}"
            ) from None
    if not isinstance(value, Lease):
        raise InvalidInput(f"lease must be a Lease returned by claim, got {type(value).__name__}")
    run_id(value.run_id)
    item_id(value.item_id)
    check_identifier(value.token, "lease.token")
    check_identifier(value.worker_id, "lease.worker_id")
    return value


def stage(value: Any) -> str | None:
    """An optional stage name."""
    if value is None:
        return None
    return check_identifier(value, "stage")


def evidence(value: Any) -> dict[str, Any]:
    """A JSON object of at most 64 KiB (None is {})."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"evidence must be a JSON object, got {type(value).__name__}")
    # strict JSON at the boundary (a NaN would poison every read of the history), as
    # plain data, with the values of secret-looking keys redacted
    plain, _text = plain_json(value, "evidence", MAX_EVIDENCE_BYTES)
    return dict(redact_evidence(plain))


def boolean(value: Any, what: str) -> bool:
    """True or false, nothing else (1 and "yes" are refused)."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be true or false, got {value!r}")
    return value
