"""A run's status is a bounded summary for ordinary readers: however many runs link to
it, its `links` hold the first `MAX_STATUS_LINKS` with `links_total` beside them, and
its size stays within a fixed bound; `lineage` lists every linked run."""

from __future__ import annotations

import json

from ledger import Ledger
from ledger.core.views import MAX_STATUS_LINKS
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, manifest


def _compensated(lg: Ledger, n: int) -> str:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.fail(run_id, CONTROLLER, "stop", transient=False)
    for k in range(n):  # one open compensation at a time: each is canceled before the next
        comp = lg.compensate(
            run_id, OPERATOR, f"undo {k}", items=[{"item_id": f"u{k}", "payload": {}}]
        )
        lg.cancel(comp.run_id, OPERATOR, "not needed")
    return run_id


def test_links_are_capped_with_their_total(lg: Ledger) -> None:
    few = _compensated(lg, 3)
    status = lg.status(few)
    assert status.links_total == 3 and len(status.links) == 3
    many = _compensated(lg, MAX_STATUS_LINKS + 15)
    status = lg.status(many)
    assert status.links_total == MAX_STATUS_LINKS + 15
    assert len(status.links) == MAX_STATUS_LINKS
    assert len(lg.lineage(many)) >= MAX_STATUS_LINKS + 15  # the whole list is one read away


def test_the_status_size_does_not_grow_with_links(lg: Ledger) -> None:
    small = len(json.dumps(lg.status(_compensated(lg, MAX_STATUS_LINKS)).to_dict(), default=str))
    large = len(json.dumps(lg.status(_compensated(lg, 200)).to_dict(), default=str))
    assert large - small < 100  # only the digits of the total differ
