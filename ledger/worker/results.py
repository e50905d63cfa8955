"""What a worker's handler returns (`Accepted`, `Rejected`, `Quarantine`: the `Outcome`
of one item's attempt) and what one `Worker.run()` reports (`WorkerSummary`). The
worker itself is ledger/worker/worker.py, which these names are importable from too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ledger.core.views import Lease


@dataclass(frozen=True)
class Accepted:
    """The item's durable effects are confirmed; `evidence` says how (receipt, checksum...)."""

    evidence: dict[str, Any] | None = None
    stage: str | None = None


@dataclass(frozen=True)
class Rejected:
    """The input failed a defined validation rule; retrying would fail the same way."""

    rule: str
    detail: str | None = None
    stage: str | None = None


@dataclass(frozen=True)
class Quarantine:
    """A failure that retries will not fix: stop automatic attempts until someone reviews it."""

    error: str
    stage: str | None = None


Outcome = Accepted | Rejected | Quarantine
Handler = Callable[[Lease], Outcome]


@dataclass
class WorkerSummary:
    """What one `Worker.run()` did, and why it returned."""

    run_id: str
    worker_id: str
    claimed: int = 0
    accepted: int = 0
    rejected: int = 0
    retryable: int = 0
    quarantined: int = 0
    lease_lost: int = 0
    heartbeats: int = 0
    stopped: str = ""
    run_state: str = ""
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


__all__ = ["Accepted", "Handler", "Outcome", "Quarantine", "Rejected", "WorkerSummary"]
