"""A rebuild folds stored item events straight into rows (ledger/projections/fold.py):
the tables it makes equal, checksum for checksum, the ones the aggregates' path makes
from the same events, and the live tables the commands wrote.

Each comparison replays one store's events twice into scratch tables: once through the
fold (`Replayer.apply_stored`, what a rebuild runs) and once with every event decoded and
applied to its aggregate (`Replayer.apply`, what verify, import and restore run), in
batches committed one by one, so rows are also read back from the tables and from the
replayer's cache between batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from ledger import Ledger
from ledger.core.domain import Item, apply_item_transition, apply_lease_extension
from ledger.core.rows import iso
from ledger.projections.checksums import checksums
from ledger.projections.fold import ITEM_TOPICS, ItemFold, ItemRow
from ledger.projections.rebuild import Replayer, create_tables, drop_tables
from ledger.service.ledger import Outcome
from ledger.stores.encoding import plain_state
from tests.histories.load import from_json, import_stored, stored_events
from tests.projections.test_rebuild import PROGRAM, Program, live_checksums
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

HISTORIES = sorted((Path(__file__).parents[1] / "histories").glob("*.json"))


class FoldCount:
    """Counts the item events the fold took and the ones it left to the aggregates."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folded = 0
        self.declined = 0
        real = ItemFold.fold

        def fold(fold_self: ItemFold, *args: Any) -> bool:
            done = real(fold_self, *args)
            if done:
                self.folded += 1
            else:
                self.declined += 1
            return done

        monkeypatch.setattr(ItemFold, "fold", fold)


def replay(lg: Ledger, suffix: str, *, fold: bool, batch: int) -> dict[str, str]:
    """Every stored event replayed into fresh tables with `suffix`, `batch` events per
    committed transaction; their checksums (the tables are dropped after)."""
    rp = Replayer(suffix)
    decode = lg.store.mapper.to_domain_event
    after = 0
    with lg.store.write() as tx:
        create_tables(tx, suffix)
    while True:
        with lg.store.write() as tx:
            rows = lg.store.read_stored_rows(tx, after, batch)
            if rows:
                if fold:
                    rp.apply_stored(tx, rows, after)
                else:
                    rp.apply(tx, [(p, decode(se)) for p, se in rows], after)  # type: ignore[misc]
        if not rows:
            break
        after = rows[-1][0]
        rp.committed(after)
    with lg.store.write() as tx:
        sums = checksums(tx, suffix)
        drop_tables(tx, suffix)
    return sums


def both_ways(lg: Ledger, batch: int) -> tuple[dict[str, str], dict[str, str]]:
    return replay(lg, "_fold", fold=True, batch=batch), replay(lg, "_aggr", fold=False, batch=batch)


def item_events(lg: Ledger) -> int:
    """Stored item events whose state the decoder reads as plain JSON (`plain_state`; it
    leaves to the eventsourcing mapper, among others, a state holding 19 digits in a row,
    as a random lease token now and then does)."""
    return sum(
        1
        for _p, se in stored_events(lg)
        if se.topic in ITEM_TOPICS and plain_state(se.state) is not None
    )


# --------------------------------------------------------------------------
# the one definition of an item's fields
# --------------------------------------------------------------------------
def test_the_aggregate_and_a_row_take_the_same_fields_from_a_transition() -> None:
    """The Item aggregate's fields and a fold's row, after the same transitions, agree:
    both are set by `apply_item_transition` (here through the aggregate's event and
    directly on the row)."""
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as lg:
        run = lg.submit(manifest(1, max_attempts=3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        lease = lg.claim(run, WORKER)[0]
        lg.fail_attempt(lease, "timeout", stage="load")
        clock.advance(60)
        lease = lg.claim(run, WORKER)[0]
        lg.heartbeat(lease)
        lg.accept(lease, stage="done")
        events = [e for _p, e in lg.store.read_events(0, 100) if hasattr(e, "item_id")]
    item = Item.begin(run, "i0", events[0].timestamp)
    row = ItemRow(run, "i0", 0, None)
    seen = []
    for e in events:
        e.mutate(item)  # type: ignore[attr-defined]
        if isinstance(e, Item.Transitioned):
            ended = apply_item_transition(
                row,
                e.command,
                e.from_state,
                e.to_state,
                e.actor_id,
                e.reason,
                e.evidence,
                iso(e.timestamp),
            )
            # an attempt's end gives the lease its row is made from, the aggregate's own
            assert (ended is not None) == (e.from_state == "in_progress" and e.command != "claim")
            if ended is not None:
                mine = item.ended_leases[e.evidence["attempt"]]
                assert ended == mine._replace(started_on=iso(mine.started_on))
        else:
            apply_lease_extension(row, e.expires_at)  # type: ignore[attr-defined]
        row.revision += 1
        # every field but updated_at (the row's is set by the fold) and the key
        theirs, mine_ = ItemRow.from_item(item).stream_values(), row.stream_values()
        assert theirs[:9] == mine_[:9] and theirs[10] == mine_[10]
        seen.append(item.state)
    assert seen == ["in_progress", "retryable", "in_progress", "in_progress", "accepted"]
    assert item.attempts == 2 and item.last_error == "timeout" and item.lease_token is None


# --------------------------------------------------------------------------
# saved histories
# --------------------------------------------------------------------------
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
@pytest.mark.parametrize("batch", [1, 5, 10_000])
def test_saved_history_folds_to_the_aggregates_tables(
    lg: Ledger, path: Path, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [from_json(e) for e in json.loads(path.read_text())["events"]]
    import_stored(lg, events)
    lg.rebuild_projections()
    live = live_checksums(lg)
    count = FoldCount(monkeypatch)
    folded, aggregates = both_ways(lg, batch)
    assert folded == aggregates == live
    # every item event of the history was folded (none fell back to the aggregates)
    assert count.folded == item_events(lg) > 0 and count.declined == 0


# --------------------------------------------------------------------------
# commands: random sequences, and events the fold leaves to the aggregates
# --------------------------------------------------------------------------
@settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=PROGRAM)
def test_random_commands_fold_to_the_live_tables(
    lg: Ledger, clock: ManualClock, ops: list[tuple[Any, ...]]
) -> None:
    """Claims, accepts, rejects, retryable and final failures, heartbeats, expiries (the
    clock moves on and the reconciler runs), cancels, amendments: a replay folding the
    item events yields the live tables, in batches of any size."""
    Program(lg, clock).run(ops)
    live = live_checksums(lg)
    for batch in (3, 10_000):
        folded, aggregates = both_ways(lg, batch)
        assert folded == aggregates == live


def test_events_left_to_the_aggregates_mix_with_folded_ones(
    lg: Ledger, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evidence holding a "_type_" key is read by the decoder (its state is not plain
    JSON to `plain_state`): those events go through the aggregates, in the middle of
    item streams whose other events are folded, and the tables still agree."""
    run = lg.submit(manifest(6, max_attempts=3), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    leases = lg.claim(run, WORKER, limit=6)
    lg.heartbeat(leases[0])
    odd = {"_type_": "note", "n": 1}
    lg.record(
        [
            Outcome(le, "accept", evidence=odd) if k % 3 == 0 else Outcome(le, "fail", error="x")
            for k, le in enumerate(leases)
        ]
    )
    clock.advance(120)
    for le in lg.claim(run, WORKER, limit=6):
        lg.heartbeat(le)
        lg.fail_attempt(le, "again", stage="s2")
    clock.advance(600)
    leases = lg.claim(run, WORKER, limit=6)
    lg.accept(leases[0], evidence=odd)
    lg.reject(leases[1], "bad-row")
    lg.cancel(run, OPERATOR, "enough")
    odd_events = [
        se
        for _p, se in stored_events(lg)
        if se.topic in ITEM_TOPICS and b'"_type_":"note"' in se.state
    ]
    assert len(odd_events) == 3 and all(plain_state(se.state) is None for se in odd_events)
    live = live_checksums(lg)
    for batch in (1, 2, 7, 10_000):
        count = FoldCount(monkeypatch)
        folded, aggregates = both_ways(lg, batch)
        assert folded == aggregates == live, batch
        assert count.declined == 0 and count.folded == item_events(lg)
    lg.rebuild_projections()
    assert live_checksums(lg) == live


def test_a_version_gap_fails_the_rebuild_as_before(lg: Ledger) -> None:
    """An item event whose version does not follow its row's is left to the aggregates,
    which refuse it as they always did (a rebuild is not a repair)."""
    run = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    lease = lg.claim(run, WORKER)[0]
    lg.accept(lease)
    stored = list(stored_events(lg))
    claim = next(p for p, se in stored if se.topic in ITEM_TOPICS)
    with lg.store.write() as tx:
        create_tables(tx, "_gap")
    rows = [(p, se) for p, se in stored if p != claim]
    assert [se.originator_version for p, se in rows if se.topic in ITEM_TOPICS] == [2]
    rp = Replayer("_gap")
    with pytest.raises(LookupError, match="first event is missing"), lg.store.write() as tx:
        rp.apply_stored(tx, rows)
    with lg.store.write() as tx:
        drop_tables(tx, "_gap")


# --------------------------------------------------------------------------
# a large generated ledger
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_ledger() -> Iterator[list[Any]]:
    """About 100,000 stored events made on a memory ledger by ordinary commands in bulk:
    claims of up to 1,000, records of accepts, rejects and retryable failures, a
    heartbeat per claim, a run canceled half way."""
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as src:
        for r in range(5):
            run = src.submit(
                manifest(10_000, max_attempts=3, partial_delivery=True), SUBMITTER
            ).run_id
            src.start(run, CONTROLLER)
            rounds = 0
            while leases := src.claim(run, WORKER, limit=1000):
                rounds += 1
                src.heartbeat(leases[0])
                clock.advance(1)
                results = src.record(
                    [
                        Outcome(le, "fail", error="flaky", stage="ocr")
                        if (i + r) % 9 == 0
                        else Outcome(le, "reject", rule="bad-row")
                        if (i + r) % 31 == 0
                        else Outcome(le, "accept")
                        for i, le in enumerate(leases)
                    ]
                )
                assert not [e for e in results if isinstance(e, Exception)]
                clock.advance(120)
                if r == 4 and rounds == 5:
                    src.cancel(run, OPERATOR, "enough")
                    break
            if r != 4:
                src.complete(run, CONTROLLER)
        yield [se for _p, se in stored_events(src)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "store_dsn", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_large_ledger_folds_to_the_aggregates_tables(
    lg: Ledger, big_ledger: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(big_ledger) >= 100_000
    import_stored(lg, big_ledger)
    count = FoldCount(monkeypatch)
    folded, aggregates = both_ways(lg, 10_000)
    assert folded == aggregates
    assert (count.folded, count.declined) == (item_events(lg), 0)
    assert count.folded > 0.99 * len(big_ledger)
    assert folded["lg_items"].startswith("50000:")
    lg.rebuild_projections()
    assert live_checksums(lg) == folded
    report = lg.verify()
    assert report.ok, report.problems
