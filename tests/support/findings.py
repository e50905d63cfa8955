"""Shared helpers of the rule-book audit tests (test_audit_findings, test_terminal_runs,
test_stateful_spec, test_rulebook_table).

`bug(n, what)` marks a test that proves one of the audit's numbered bugs: a strict xfail
while the bug is open, so the suite stays green and the fix turns it into an XPASS
failure (then the marker goes). `LEDGER_XFAIL_OFF=1` drops every such marker, to see the
tests fail on code where the bugs are still open:

    LEDGER_XFAIL_OFF=1 pytest tests/commands/test_audit_findings.py
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from ledger import Ledger, LedgerError
from tests.support.drive import event_count


def bug(n: int, what: str) -> pytest.MarkDecorator:
    """Strict xfail for the audit's bug `n` (a no-op mark with LEDGER_XFAIL_OFF=1)."""
    expect_failure = os.environ.get("LEDGER_XFAIL_OFF") != "1"
    return pytest.mark.xfail(expect_failure, strict=True, reason=f"audit bug {n}: {what}")


def refused(
    lg: Ledger, exc: type[LedgerError] | tuple[type[LedgerError], ...], fn: Callable[[], Any]
) -> LedgerError:
    """`fn` raises `exc` and writes no event."""
    before = event_count(lg)
    with pytest.raises(exc) as info:
        fn()
    assert event_count(lg) == before, f"the refusal ({info.value!r}) wrote events"
    err = info.value
    assert isinstance(err, LedgerError)
    return err


def verify_clean(lg: Ledger) -> None:
    """`verify` finds nothing wrong with the ledger's own history."""
    report = lg.verify()
    assert report.ok, report.problems


def run_transitions(lg: Ledger, run_id: str) -> list[Any]:
    """The run's own transitions (no item ones), in position order."""
    return [t for t in lg.history(run_id) if t.item_id is None]
