"""The record-keeping operations of `Ledger` (ledger/service/ledger.py): `LedgerMaintenance`, a
mixin the facade inherits: verify, rebuild the projections, prune idempotency keys,
export and import history files, archive and restore runs. Each checks its arguments at
the boundary (`InvalidInput`) and delegates to its module; refusals are typed
(`typed_refusals`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from ledger.commands.idempotency import typed_refusals
from ledger.core.errors import InvalidInput
from ledger.core.validation import check_unicode, utc_time
from ledger.core.views import Actor, VerifyReport
from ledger.stores.base import Store

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.transfer.archive_file import ArchiveSummary
    from ledger.transfer.exports import TransferSummary


class LedgerMaintenance:
    """`Ledger`'s operations on the record as a whole."""

    store: Store

    def _facade(self) -> Ledger:
        """This object as the `Ledger` it is a part of (the modules below take one)."""
        return cast("Ledger", self)

    @typed_refusals
    def verify(
        self,
        progress: Callable[[str, int, int], None] | None = None,
        checkpoints: list[str] | None = None,
        vkeys: list[str] | None = None,
    ) -> VerifyReport:
        """Replay every event and report broken rules and projection drift. `progress(stage,
        done, total)` follows it: "replay" after each batch (events done, events stored), then
        "compare" and "chains" as they start. With `checkpoints` (signed checkpoint texts) and
        `vkeys` (verifier keys), also check the ledger against each (service/checkpoints.py)."""
        from ledger.projections.verify import verify

        if progress is not None and not callable(progress):
            raise InvalidInput("progress must be a callable (stage, done, total)")
        if checkpoints:
            from ledger.service.checkpoints import check_checkpoints, parse_verifiers

            parse_verifiers(vkeys or [])  # refuse bad keys before the replay
        report = verify(self._facade(), progress)
        if checkpoints:
            found = check_checkpoints(self._facade(), checkpoints, vkeys or [])
            if found:
                report = replace(report, ok=False, problems=[*report.problems, *found])
        return report

    @typed_refusals
    def prune_idempotency_keys(self, older_than: timedelta) -> int:
        """Forget idempotency keys recorded more than `older_than` ago (by the store's clock);
        returns how many. A repeat with a forgotten key is a new command."""
        from ledger.commands.idempotency import prune

        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidInput("older_than must be a non-negative timedelta")
        with self.store.read() as tx:
            now = tx.now()
        try:
            before = now - older_than
        except OverflowError:
            return 0  # longer ago than the calendar goes: no key is that old
        return prune(self.store, before)

    @typed_refusals
    def export(
        self,
        file: Any,
        runs: Any = None,
        since: datetime | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> TransferSummary:
        """Write the events (of `runs`, recorded since `since`) to the text file object `file`
        as history lines with their hashes and a closing line of stream heads
        (ledger/transfer/imports.py); returns a TransferSummary."""
        from ledger.core import args as A
        from ledger.transfer.exports import export

        if not callable(getattr(file, "write", None)):
            raise InvalidInput(f"file must be a text file object, got {type(file).__name__}")
        if runs is not None:
            if isinstance(runs, (str, bytes)) or not isinstance(
                runs, (list, tuple, set, frozenset)
            ):
                raise InvalidInput("runs must be a list of run ids")
            runs = [A.run_id(r) for r in runs]
        if since is not None:
            since = utc_time(since, "since")
        _progress(progress)
        return export(self._facade(), file, runs=runs, since=since, progress=progress)

    @typed_refusals
    def import_file(
        self, source: Any, progress: Callable[[int, int], None] | None = None, verify: bool = True
    ) -> TransferSummary:
        """Check a history file (a path or text file object) and append its events with their
        hashes, projected, in one transaction; then verify (ledger/transfer/imports.py)."""
        from ledger.transfer.imports import import_file

        _source(source)
        if not isinstance(verify, bool):
            raise InvalidInput(f"verify must be true or false, got {type(verify).__name__}")
        _progress(progress)
        return import_file(self._facade(), source, progress=progress, verify=verify)

    @typed_refusals
    def archive(
        self,
        actor: Actor,
        to: Any,
        terminal_before: datetime | None = None,
        runs: list[str] | None = None,
        reason: str | None = None,
        force: bool = False,
    ) -> ArchiveSummary:
        """Move the events of runs terminal since before `terminal_before` (or of `runs`)
        into the verified archive file `to`, leaving one Archived event per run in its
        chain (operator role; ledger/transfer/archive.py). Resumes an interrupted archive.
        Refused while a follower or webhook has not passed those runs' transitions, unless
        `force` with a `reason` (recorded in each Archived event)."""
        from ledger.transfer.archive import archive

        _path(to, "to")
        if not isinstance(force, bool):
            raise InvalidInput("force must be true or false")
        return archive(
            self._facade(),
            actor,
            to,
            terminal_before=terminal_before,
            runs=runs,
            reason=reason,
            force=force,
        )

    @typed_refusals
    def archived(self, run_id: str) -> dict[str, Any] | None:
        """Where an archived run's events went (file, sha256, digest, events, when, by whom);
        None when the run is not archived. Its history and attempts are in that file."""
        from ledger.transfer.archive import archived_run

        return archived_run(self._facade(), run_id)

    @typed_refusals
    def restore(self, actor: Actor, source: Any) -> ArchiveSummary:
        """Bring archived runs back from their archive file, once it is proven to hold the
        events that left (operator role; ledger/transfer/archive.py)."""
        from ledger.transfer.archive import restore

        _path(source, "source")
        return restore(self._facade(), actor, source)

    @typed_refusals
    def rebuild_projections(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop and rebuild every projection from the first event; returns the events replayed."""
        from ledger.projections.rebuild import rebuild

        _progress(progress)
        return rebuild(self._facade(), progress=progress)


def _progress(progress: Any) -> None:
    if progress is not None and not callable(progress):
        raise InvalidInput("progress must be None or a callable")


def _path(value: Any, what: str) -> None:
    """A file path: text (or os.PathLike) without NUL or lone surrogates."""
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidInput(f"{what} must be a file path, got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str) or "\x00" in path:
        raise InvalidInput(f"{what} must be a file path without NUL characters")
    check_unicode(path, what)
    # longer names than any file system takes are bad input, not an OSError later
    if len(path.encode()) > 4096 or any(len(part.encode()) > 255 for part in path.split(os.sep)):
        raise InvalidInput(f"{what} is not a usable file path (a name over 255 bytes)")


def _source(source: Any) -> None:
    """A file to read: a path (text without NUL or lone surrogates) or a text file object."""
    if isinstance(source, (str, os.PathLike)):
        _path(source, "source")
    elif not callable(getattr(source, "read", None)):
        raise InvalidInput(
            f"source must be a path or a text file object, got {type(source).__name__}"
        )
