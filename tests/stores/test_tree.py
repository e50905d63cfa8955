"""The stored Merkle tree (ledger/stores/tree.py) answers exactly as the tree computed from
scratch over the events table: roots, inclusion and consistency proofs for random sizes,
on every store, as the ledger grows; on PostgreSQL a slower writer's event never lands
inside the stored tree, and several processes appending at once leave a tree whose leaves
are the events in position order."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import queue
import random
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ledger import Ledger
from ledger.core import merkle as M
from ledger.stores import pg_positions
from ledger.stores import tree as T
from ledger.stores.leaves import iter_leaves
from ledger.stores.postgres import EVENTS_TABLE
from ledger.stores.raw import RawEvent, append_raw
from tests.support.runs import finished_run

SPAWN = multiprocessing.get_context("spawn")
WAIT = 120.0  # a bound on waiting for a child, never a timing assertion


def from_scratch(lg: Ledger) -> tuple[list[int], list[bytes]]:
    """(positions, leaf hashes) of every readable event, read from the events table."""
    with lg.store.read() as tx:
        pairs = list(iter_leaves(tx))
    return [p for p, _h in pairs], [h for _p, h in pairs]


def extend(lg: Ledger) -> int:
    with lg.store.write() as tx:
        return T.extend(tx)


def check_against_scratch(lg: Ledger, rng: random.Random, probes: int = 12) -> int:
    n = extend(lg)
    _positions, leaves = from_scratch(lg)
    assert n == len(leaves)
    with lg.store.read() as tx:
        for size in {n, *(rng.randint(0, n) for _ in range(probes))}:
            assert T.root(tx, size) == M.root(leaves[:size])
            if size:
                index = rng.randrange(size)
                leaf, root, proof = T.inclusion(tx, index, size)
                assert (leaf, root) == (leaves[index], M.root(leaves[:size]))
                assert proof == M.inclusion_proof(index, size, leaves)
                assert M.verify_inclusion(leaf, index, size, proof, root)
            first = rng.randint(0, size)
            old, new, proof = T.consistency(tx, first, size)
            assert proof == M.consistency_proof(first, size, leaves)
            assert M.verify_consistency(first, size, old, new, proof)
    return n


def test_the_stored_tree_gives_the_roots_and_proofs_of_the_tree_from_scratch(lg: Ledger) -> None:
    rng = random.Random(29)
    assert check_against_scratch(lg, rng) == 0
    sizes = []
    for _ in range(6):
        for _ in range(rng.randint(1, 3)):
            finished_run(lg, rng.randint(1, 4))
        sizes.append(check_against_scratch(lg, rng))
    assert sizes == sorted(sizes) and sizes[-1] > 64  # several levels of subtrees
    # nothing new: extending again changes nothing
    assert extend(lg) == sizes[-1]


def test_extending_in_pages_with_unchained_and_damaged_hashes_matches_the_tree_from_scratch(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set-based extend (a page of events read at once, the leaves and nodes of a page
    written at once) over pages that end anywhere, and events whose leaf is not their
    recorded hash: none (written before the hash chain) or one that is not 64 hex digits."""
    monkeypatch.setattr(T, "PAGE", 7)
    rng = random.Random(12)
    position = 0
    for step in range(8):
        events = []
        for _ in range(rng.randint(1, 40)):
            position += 1
            kind = rng.random()
            hx = (
                None
                if kind < 0.1
                else "not-hex" + "z" * 57
                if kind < 0.15
                else "short"
                if kind < 0.2
                else hashlib.sha256(position.to_bytes(8, "big")).hexdigest()
            )
            events.append(
                RawEvent(position, uuid.UUID(int=position), 1, "t", f"{{{step}}}".encode(), hx)
            )
        with lg.store.write() as tx:
            append_raw(tx, events, keep_positions=True)
        check_against_scratch(lg, rng, probes=6)
    assert extend(lg) == position > 2**T.STORED_LEVEL * 8


def test_a_size_beyond_the_tree_is_refused(lg: Ledger) -> None:
    finished_run(lg)
    n = extend(lg)
    with lg.store.read() as tx, pytest.raises(ValueError, match="fewer than"):
        T.root(tx, n + 1)


# ---- PostgreSQL: the feed's horizon -------------------------------------------------------------
INSERT = pg_positions.insert_json_statement(psycopg.sql.Identifier(EVENTS_TABLE))


def _insert(conn: psycopg.Connection[Any], n: int = 1) -> list[int]:
    """Insert `n` events of a new stream in the connection's open transaction."""
    oid = str(uuid.uuid4())
    rows = json.dumps([[oid, v, "test-event", "{}"] for v in range(1, n + 1)])
    return [r["notification_id"] for r in conn.execute(INSERT, (n, rows)).fetchall()]


def _leaf_positions(lg: Ledger) -> list[int]:
    with lg.store.read() as tx:
        rows = tx.fetchall("SELECT position FROM lg_merkle_leaves ORDER BY leaf_index")
    return [int(r["position"]) for r in rows]


@pytest.mark.postgres
def test_a_slower_writer_never_lands_inside_the_stored_tree(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        finished_run(lg)
        before = extend(lg)
        slow = psycopg.connect(pg_dsn, row_factory=dict_row)
        fast = psycopg.connect(pg_dsn, row_factory=dict_row)
        try:
            low = _insert(slow, 2)
            high = _insert(fast, 3)
            fast.commit()
            # the faster commit is visible, but below it a position may still be filled
            assert extend(lg) == before
            slow.commit()
            assert extend(lg) == before + 5
            assert _leaf_positions(lg)[-5:] == [*low, *high]
            check_against_scratch(lg, random.Random(5))
        finally:
            slow.close()
            fast.close()


def _writer(dsn: str, rounds: int, seed: int, out: Any) -> None:
    try:
        rng = random.Random(seed)
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            for _ in range(rounds):
                _insert(conn, rng.randint(1, 4))
                if rng.random() < 0.2:
                    conn.rollback()  # a gap in the positions
                else:
                    conn.commit()
        out.put(("ok", seed))
    except BaseException as e:  # reported to the parent, which fails the test
        out.put(("error", repr(e)))


@pytest.mark.postgres
@pytest.mark.slow
def test_concurrent_appends_from_several_processes_keep_the_tree_in_position_order(
    pg_dsn: str,
) -> None:
    Ledger.open(pg_dsn).close()
    out = SPAWN.Queue()
    children = [SPAWN.Process(target=_writer, args=(pg_dsn, 60, s, out)) for s in range(3)]
    for c in children:
        c.start()
    done: list[Any] = []
    with Ledger.open(pg_dsn) as lg:
        sizes = []
        while len(done) < len(children):
            sizes.append(extend(lg))  # the tree grows while the writers commit
            with contextlib.suppress(queue.Empty):
                done.append(out.get(timeout=0.05))
            assert len(sizes) < 100_000, "the writers never finished"
        for c in children:
            c.join(WAIT)
        assert all(d[0] == "ok" for d in done), done
        assert sizes == sorted(sizes)
        n = check_against_scratch(lg, random.Random(7), probes=30)
        positions, _leaves = from_scratch(lg)
        assert _leaf_positions(lg) == positions and n == len(positions) > 0
