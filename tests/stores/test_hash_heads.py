"""The events a command appends chain to their streams' last stored events, whether the
command read those heads with its rows (record) or the append reads them itself."""

from __future__ import annotations

from eventsourcing.persistence import StoredEvent

from ledger import Ledger
from ledger.core.domain import item_stream_id
from ledger.service.ledger import Outcome
from ledger.stores.hashchain import (
    GENESIS,
    chain_hashes,
    event_hash,
    fetch_hashes,
    heads_statement,
    note_heads,
)
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest


def _hashes(lg: Ledger, run_id: str, item_ids: list[str]) -> dict[tuple[object, int], str]:
    streams = [item_stream_id(run_id, i) for i in item_ids]
    with lg.store.read() as tx:
        return fetch_hashes(tx, [(s, v) for s in streams for v in range(1, 7)])


def test_record_after_claims_and_retries_chains_every_event(lg: Ledger, clock: ManualClock) -> None:
    run = lg.submit(manifest(6, max_attempts=3, backoff_seconds=1), SUBMITTER)
    lg.start(run.run_id, CONTROLLER)
    for _round in range(3):
        leases = lg.claim(run.run_id, WORKER, limit=6)
        outcomes = [
            Outcome(lease, "fail", error="again") if k % 2 else Outcome(lease, "accept")
            for k, lease in enumerate(leases)
        ]
        assert all(not isinstance(r, Exception) for r in lg.record(outcomes))
        clock.advance(2)
    report = lg.verify()
    assert report.ok, report.problems
    stored = _hashes(lg, run.run_id, [f"i{k}" for k in range(6)])
    # every item stream got more than one event, each chained (verify recomputed them)
    assert {v for (_s, v) in stored} >= {1, 2, 3}


def test_the_heads_a_command_read_are_used_only_for_their_own_version(lg: Ledger) -> None:
    run = lg.submit(manifest(1), SUBMITTER)
    lg.start(run.run_id, CONTROLLER)
    [lease] = lg.claim(run.run_id, WORKER)
    lg.record([Outcome(lease, "accept")])
    stream = item_stream_id(run.run_id, lease.item_id)
    with lg.store.write() as tx:
        sql, params = heads_statement(tx, [stream])
        note_heads(tx, tx.fetch_rows(sql, params))
        head = fetch_hashes(tx, [(stream, 2)])[(stream, 2)]
        assert tx.known_hashes == {(stream, 2): head}
        # a head read at another version than the one an event follows is not used
        tx.known_hashes[(stream, 2)] = "not the stored hash"
        event = StoredEvent(stream, 3, "t", b"{}")
        assert chain_hashes(tx, [event]) == [
            event_hash("not the stored hash", stream, 3, "t", b"{}")
        ]
        tx.known_hashes.clear()
        tx.known_hashes[(stream, 1)] = "not the stored hash"
        assert chain_hashes(tx, [event]) == [event_hash(head, stream, 3, "t", b"{}")]
        # a stream without events has no head: its first event chains to GENESIS
        other = item_stream_id(run.run_id, "no-such-item")
        note_heads(tx, tx.fetch_rows(*heads_statement(tx, [other])))
        first = StoredEvent(other, 1, "t", b"{}")
        assert chain_hashes(tx, [first]) == [event_hash(GENESIS, other, 1, "t", b"{}")]
        tx.execute("SELECT 1")  # nothing written: the transaction commits empty
