"""run-ledger: the durable, auditable, event-sourced record of workflow and batch runs.

The public names (docs/reference/python-api.md); a test pins this list. Heavy modules load lazily so
that `ledger status` starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledger.core.errors import (
    AlreadyTerminal,
    Conflict,
    FollowerBusy,
    FollowerNotFound,
    IllegalTransition,
    InvalidInput,
    InvariantViolated,
    ItemNotFound,
    LeaseLost,
    LedgerError,
    ManifestInvalid,
    NotAuthorized,
    NotComplete,
    RunArchived,
    RunNotFound,
    StaleReview,
    WebhookNotFound,
)
from ledger.core.views import (
    Actor,
    Attempt,
    CancelOutcome,
    ItemStatus,
    Lease,
    Link,
    ReconcileReport,
    RunStatus,
    Transition,
    VerifyReport,
)

if TYPE_CHECKING:
    __version__: str  # the installed distribution's version (`ledger --version`)
    from ledger.core.manifest import Manifest, Policy
    from ledger.feed.async_follower import AsyncFollower
    from ledger.feed.follower import Follower
    from ledger.reads.board import BoardPage, BoardRow
    from ledger.reads.overview import Overview, StuckRun
    from ledger.service.async_ledger import AsyncLedger
    from ledger.service.ledger import Ledger
    from ledger.worker.async_worker import AsyncWorker
    from ledger.worker.worker import Accepted, Quarantine, Rejected, Worker

_LAZY = {
    "Ledger": "service.ledger",
    "Overview": "reads.overview",
    "StuckRun": "reads.overview",
    "BoardPage": "reads.board",
    "BoardRow": "reads.board",
    "Follower": "feed.follower",
    "Manifest": "core.manifest",
    "Policy": "core.manifest",
    "Worker": "worker.worker",
    "AsyncLedger": "service.async_ledger",
    "AsyncWorker": "worker.async_worker",
    "AsyncFollower": "feed.async_follower",
    "Accepted": "worker.worker",
    "Rejected": "worker.worker",
    "Quarantine": "worker.worker",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("run-ledger")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read from the installed metadata on first use only
        return _version()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ledger.{module}"), name)


__all__ = [
    "Accepted",
    "Actor",
    "AlreadyTerminal",
    "AsyncFollower",
    "AsyncLedger",
    "AsyncWorker",
    "Attempt",
    "BoardPage",
    "BoardRow",
    "CancelOutcome",
    "Conflict",
    "Follower",
    "FollowerBusy",
    "FollowerNotFound",
    "IllegalTransition",
    "InvalidInput",
    "InvariantViolated",
    "ItemNotFound",
    "ItemStatus",
    "Lease",
    "LeaseLost",
    "Ledger",
    "LedgerError",
    "Link",
    "Manifest",
    "ManifestInvalid",
    "NotAuthorized",
    "NotComplete",
    "Overview",
    "Policy",
    "Quarantine",
    "ReconcileReport",
    "Rejected",
    "RunArchived",
    "RunNotFound",
    "RunStatus",
    "StaleReview",
    "StuckRun",
    "Transition",
    "VerifyReport",
    "WebhookNotFound",
    "Worker",
]
