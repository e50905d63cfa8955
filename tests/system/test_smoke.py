"""A first end-to-end pass on every store."""

from __future__ import annotations

from ledger import Ledger
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest


def test_submit_claim_accept_complete(lg: Ledger) -> None:
    st = lg.submit(manifest(3), SUBMITTER)
    assert st.state == "queued" and st.counts["pending"] == 3 and st.waiting_on == "controller"
    lg.start(st.run_id, CONTROLLER)
    leases = lg.claim(st.run_id, WORKER, limit=5)
    assert sorted(le.item_id for le in leases) == ["i0", "i1", "i2"]
    for le in leases:
        assert lg.accept(le).state == "accepted"
    done = lg.complete(st.run_id, CONTROLLER)
    assert done.state == "succeeded" and done.waiting_on == "nobody"
    hist = lg.history(st.run_id)
    assert [t.command for t in hist][:2] == ["submit", "start"]
    assert [t.position for t in hist] == sorted(t.position for t in hist)
