"""The ledger's Merkle tree kept in the database, so a root or a proof is a few reads.

Two tables (schema version 12): `lg_merkle_leaves`, one row per leaf (its index, its
event's position, its data as ledger/stores/leaves.py defines it, and `gone` when the
ledger itself removed the event: archive, restore), and `lg_merkle_nodes`, the root of
every perfect subtree above the leaves, keyed by `level * 2**48 + index` (the subtree
(level, index) holds leaves index * 2**level up to (index + 1) * 2**level - 1). Any
range a root or a proof needs is a few such subtrees (`merkle.perfect_subtrees`), so a
root over a million leaves is about 20 rows and a proof a few dozen, read by primary key
in one statement each.

The tree grows by `extend`: the events above the last leaf's position, up to the change
feed's horizon (`leaves.horizon`), become the next leaves, their completed subtrees are
stored, in one transaction taken one at a time (PostgreSQL: an advisory lock; SQLite has
one writer). Every reader of the tree extends it first, so it is a follower kept in the
database; an append pays nothing, and events enter in the order the feed reads them:
a commit still to come never lands inside a size already read or signed.

Leaves are never deleted: archiving a run marks the leaves of the events it deletes
`gone` (`mark_gone`, in the deleting transaction, after extending the tree), so an old
checkpoint still verifies and an archived event is still provable; `restored` checks an
event put back against its leaf.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from uuid import UUID

from ledger.core import merkle as M
from ledger.core.errors import InvariantViolated, StoreUnavailable
from ledger.stores.base import Tx
from ledger.stores.leaves import PAGE, horizon, leaf_data, leaf_data_of
from ledger.stores.named import tx_list
from ledger.stores.sql import STATEMENTS

LEVEL_SHIFT = 48
TREE_LOCK = zlib.crc32(b"run-ledger merkle tree") & 0x7FFFFFFF
_CHUNK = 1000  # ids per `{in_list}` statement


def node_key(level: int, index: int) -> int:
    """The key of perfect subtree (level, index), level >= 1."""
    return (level << LEVEL_SHIFT) + index


def last_leaf(tx: Tx) -> tuple[int, int]:
    """(size, position of the last leaf; 0 for an empty tree)."""
    row = tx.fetchone(STATEMENTS.sql(tx, "tree_last_leaf"))
    if row is None:
        return 0, 0
    return int(row["leaf_index"]) + 1, int(row["position"])


def size(tx: Tx) -> int:
    """How many leaves the stored tree has."""
    return last_leaf(tx)[0]


def subtrees(tx: Tx, wanted: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """The stored roots of some perfect subtrees, (level, index) -> hash; level 0 are
    leaf hashes. Two statements, whatever their number (the keys are primary keys)."""
    keys = set(wanted)
    leaves = sorted(i for lv, i in keys if lv == 0)
    nodes = sorted(node_key(lv, i) for lv, i in keys if lv > 0)
    out: dict[tuple[int, int], bytes] = {}
    for i in range(0, len(leaves), _CHUNK):
        rows = tx.fetchall(
            STATEMENTS.sql(tx, "tree_leaves_at"), (tx_list(tx, leaves[i : i + _CHUNK]),)
        )
        for r in rows:
            out[(0, int(r["leaf_index"]))] = M.leaf_hash(bytes(r["data"]))
    mask = (1 << LEVEL_SHIFT) - 1
    for i in range(0, len(nodes), _CHUNK):
        rows = tx.fetchall(
            STATEMENTS.sql(tx, "tree_nodes_at"), (tx_list(tx, nodes[i : i + _CHUNK]),)
        )
        for r in rows:
            k = int(r["node"])
            out[(k >> LEVEL_SHIFT, k & mask)] = bytes(r["hash"])
    missing = keys - out.keys()
    if missing:
        raise InvariantViolated(
            f"the stored Merkle tree lacks {len(missing)} subtree(s), e.g. {min(missing)}: "
            "its tables were changed behind the ledger's back",
            kind="merkle_tree",
        )
    return out


def _store(tx: Tx, leaves: list[tuple[int, int, bytes]], nodes: list[tuple[int, bytes]]) -> None:
    """Insert a page of leaves and nodes: PostgreSQL takes each as arrays in one statement."""
    if tx.store.dialect == "postgres":
        if leaves:
            idx, pos, data = zip(*leaves, strict=True)
            tx.execute(
                STATEMENTS.sql(tx, "pg_tree_insert_leaves"), (list(idx), list(pos), list(data))
            )
        if nodes:
            keys, hashes = zip(*nodes, strict=True)
            tx.execute(STATEMENTS.sql(tx, "pg_tree_insert_nodes"), (list(keys), list(hashes)))
        return
    tx.executemany(STATEMENTS.sql(tx, "tree_insert_leaf"), leaves)
    if nodes:
        tx.executemany(STATEMENTS.sql(tx, "tree_insert_node"), nodes)


def extend(tx: Tx) -> int:
    """Add the events above the last leaf, up to the feed's horizon, as leaves (and the
    subtrees they complete); returns the tree's size. Call in a write transaction."""
    if tx.store.dialect == "postgres":
        tx.execute(STATEMENTS.sql(tx, "tree_lock"), (TREE_LOCK,))
    n, after = last_leaf(tx)
    have = subtrees(tx, M.perfect_subtrees(0, n))
    frontier = M.Frontier.of(n, [have[k] for k in M.perfect_subtrees(0, n)])
    upto = horizon(tx)  # a statement of its own, before the reads
    sql = STATEMENTS.sql(tx, "merkle_leaves")
    while after < upto:
        rows = tx.fetchall(sql, (after, upto, PAGE))
        if not rows:
            break
        leaves: list[tuple[int, int, bytes]] = []
        nodes: list[tuple[int, bytes]] = []
        for r in rows:
            data = leaf_data(r)
            leaves.append((frontier.size, int(r["position"]), data))
            for level, index, h in frontier.append(M.leaf_hash(data)):
                nodes.append((node_key(level, index), h))
        _store(tx, leaves, nodes)
        after = int(rows[-1]["position"])
        if len(rows) < PAGE:
            break
    return frontier.size


def load(tx: Tx, rows: Iterable[tuple[int, bytes]]) -> int:
    """Append leaves given as (position, data), positions above the last leaf's, with
    their subtrees, in pages (bulk set-up: the bench, a copy); returns the size."""
    n, _after = last_leaf(tx)
    have = subtrees(tx, M.perfect_subtrees(0, n))
    frontier = M.Frontier.of(n, [have[k] for k in M.perfect_subtrees(0, n)])
    leaves: list[tuple[int, int, bytes]] = []
    nodes: list[tuple[int, bytes]] = []

    def flush() -> None:
        _store(tx, leaves, nodes)
        leaves.clear()
        nodes.clear()

    for position, data in rows:
        leaves.append((frontier.size, position, data))
        for level, index, h in frontier.append(M.leaf_hash(data)):
            nodes.append((node_key(level, index), h))
        if len(leaves) >= PAGE:
            flush()
    flush()
    return frontier.size


def _check(tx: Tx, at: int) -> None:
    n = size(tx)
    if at > n:
        raise ValueError(f"the tree has {n} leaves, fewer than {at}")


def root(tx: Tx, at: int) -> bytes:
    """The root of the tree of the first `at` leaves."""
    _check(tx, at)
    keys = M.perfect_subtrees(0, at)
    have = subtrees(tx, keys)
    return M.fold([have[k] for k in keys])


def _range_roots(
    tx: Tx, prove: Any, at: int, extra: Sequence[tuple[int, int]]
) -> tuple[list[bytes], dict[tuple[int, int], bytes]]:
    """Run a proof once to learn which subtrees it reads, fetch them all in one go, run it
    again on them."""
    asked: set[tuple[int, int]] = set(extra) | set(M.perfect_subtrees(0, at))

    def record(lo: int, hi: int) -> bytes:
        asked.update(M.perfect_subtrees(lo, hi))
        return M.EMPTY_ROOT

    prove(record)
    have = subtrees(tx, asked)
    proof: list[bytes] = prove(lambda lo, hi: M.fold([have[k] for k in M.perfect_subtrees(lo, hi)]))
    return proof, have


def inclusion(tx: Tx, index: int, at: int) -> tuple[bytes, bytes, list[bytes]]:
    """(leaf hash, root, proof) of leaf `index` in the tree of the first `at` leaves."""
    _check(tx, at)
    proof, have = _range_roots(tx, lambda rr: M.inclusion_path(index, at, rr), at, [(0, index)])
    return have[(0, index)], M.fold([have[k] for k in M.perfect_subtrees(0, at)]), proof


def inclusions(
    tx: Tx, indexes: Sequence[int], at: int
) -> tuple[bytes, list[tuple[bytes, list[bytes]]]]:
    """(root, [(leaf hash, proof)]) of several leaves in the tree of the first `at` leaves:
    every subtree they need read in one go."""
    _check(tx, at)
    asked: set[tuple[int, int]] = set(M.perfect_subtrees(0, at))

    def record(lo: int, hi: int) -> bytes:
        asked.update(M.perfect_subtrees(lo, hi))
        return M.EMPTY_ROOT

    for i in indexes:
        asked.add((0, i))
        M.inclusion_path(i, at, record)
    have = subtrees(tx, asked)

    def rr(lo: int, hi: int) -> bytes:
        return M.fold([have[k] for k in M.perfect_subtrees(lo, hi)])

    root = M.fold([have[k] for k in M.perfect_subtrees(0, at)])
    return root, [(have[(0, i)], M.inclusion_path(i, at, rr)) for i in indexes]


def consistency(tx: Tx, first: int, second: int) -> tuple[bytes, bytes, list[bytes]]:
    """(root at `first`, root at `second`, proof) that the first is a prefix."""
    _check(tx, second)
    extra = M.perfect_subtrees(0, first)
    proof, have = _range_roots(tx, lambda rr: M.consistency_path(first, second, rr), second, extra)
    return (
        M.fold([have[k] for k in extra]),
        M.fold([have[k] for k in M.perfect_subtrees(0, second)]),
        proof,
    )


def leaves_at(tx: Tx, positions: Sequence[int]) -> dict[int, tuple[int, bytes, bool]]:
    """position -> (leaf index, data, gone) of the leaves of some events."""
    out: dict[int, tuple[int, bytes, bool]] = {}
    ordered = sorted(set(positions))
    for i in range(0, len(ordered), _CHUNK):
        rows = tx.fetchall(
            STATEMENTS.sql(tx, "tree_leaves_by_position"), (tx_list(tx, ordered[i : i + _CHUNK]),)
        )
        for r in rows:
            out[int(r["position"])] = (int(r["leaf_index"]), bytes(r["data"]), bool(r["gone"]))
    return out


def effective_leaves(tx: Tx, limit: int) -> Iterator[tuple[bytes, bool]]:
    """For verify against checkpoints: up to `limit` leaves recomputed from the events
    table, as (leaf hash, differs from the stored leaf). A leaf whose event the ledger
    removed (`gone`) counts with its stored data; one whose event is missing otherwise is
    left out, as if the events table were the whole truth, so a deletion behind the
    ledger's back shortens or changes the tree."""
    start, given = 0, 0
    sql = STATEMENTS.sql(tx, "tree_leaves_with_events")
    while given < limit:
        rows = tx.fetchall(sql, (start, start + PAGE))
        for r in rows:
            stored = bytes(r["data"])
            if int(r["present"]):
                data = leaf_data(r)
                yield M.leaf_hash(data), data != stored
            elif int(r["gone"]):
                yield M.leaf_hash(stored), False
            else:
                continue
            given += 1
            if given >= limit:
                return
        if len(rows) < PAGE:
            return
        start += PAGE


def mark_gone(tx: Tx, deletions: Sequence[Sequence[Any]]) -> None:
    """Before the ledger deletes events (each the parameters of `delete_stream_events`:
    stream ids, highest and lowest version), mark their leaves gone. The tree is extended
    first; an event to delete that is still not a leaf (above the feed's horizon: a slower
    writer holds it back) is refused, since it would never enter the tree."""
    extend(tx)
    _n, after = last_leaf(tx)
    unleafed, mark = STATEMENTS.sql(tx, "tree_unleafed"), STATEMENTS.sql(tx, "tree_mark_gone")
    for params in deletions:
        row = tx.fetchone(unleafed, (*params, after))
        if row is not None and int(row["n"]):
            raise StoreUnavailable(
                "some events to delete are not in the Merkle tree yet (a slower writer "
                "holds the change feed's horizon below them); try again"
            )
        tx.execute(mark, tuple(params))


def restored(
    tx: Tx,
    events: Sequence[tuple[int, UUID, int, str, bytes, str | None]],
    kept: bool,
) -> str | None:
    """Events put back (position as archived, stream, version, topic, state, hash): each
    must hash to its leaf; returns what is wrong when one does not (the caller refuses,
    writing nothing). With `kept` (back at their positions) their leaves are no longer
    gone."""
    have = leaves_at(tx, [e[0] for e in events])
    for position, stream, version, topic, state, hx in events:
        leaf = have.get(position)
        if leaf is None:
            continue  # never a leaf: it enters the tree as any event does
        if leaf_data_of(hx, stream, version, topic, state) != leaf[1]:
            return (
                f"the event {stream} v{version} does not hash to its leaf {leaf[0]} in the "
                "Merkle tree: it is not the event that was archived"
            )
    if kept:
        ordered = sorted(have)
        mark_back = STATEMENTS.sql(tx, "tree_mark_back")
        for i in range(0, len(ordered), _CHUNK):
            tx.execute(mark_back, (tx_list(tx, ordered[i : i + _CHUNK]),))
    return None
