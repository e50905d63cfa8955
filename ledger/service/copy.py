"""`copy_ledger`: every event of one ledger into another, through an export to a
temporary file and an import of it (SQLite to PostgreSQL and back, or between files).
The import is the writer: every event passes the rule checker before anything commits,
and only runs the target does not hold are added (ledger/transfer/imports.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import IO, cast

from ledger.core.errors import InvalidInput
from ledger.service.ledger import Ledger
from ledger.transfer.exports import TransferSummary, export
from ledger.transfer.imports import Progress, import_file


# --------------------------------------------------------------------------
def copy_ledger(
    source_dsn: str,
    target_dsn: str,
    progress: Callable[[str, int, int], None] | None = None,
    verify: bool = True,
) -> TransferSummary:
    """Copy every event of one ledger into another (export into a temporary file, then
    import it), with `progress(stage, done, total)`: "export", then "import"."""
    if source_dsn == target_dsn:
        raise InvalidInput("--from and --to name the same ledger")
    src = Ledger.open(source_dsn)
    try:
        with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
            exported = export(src, cast(IO[str], spool), progress=_staged(progress, "export"))
            spool.seek(0)
            dst = Ledger.open(target_dsn)
            try:
                return import_file(
                    dst,
                    spool,
                    progress=_staged(progress, "import"),
                    verify=verify,
                    total=exported.events,
                )
            finally:
                dst.close()
    finally:
        src.close()


def _staged(progress: Callable[[str, int, int], None] | None, stage: str) -> Progress | None:
    if progress is None:
        return None
    report = progress
    return lambda done, total: report(stage, done, total)


__all__ = ["copy_ledger"]
