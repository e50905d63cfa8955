"""The ledger's Merkle tree kept in the database, so a root or a proof is a few reads.

Two tables (schema version 12): `lg_merkle_leaves`, one row per leaf (its index, its
event's position, its data as ledger/stores/leaves.py defines it, and `gone` when the
ledger itself removed the event: archive, restore), and `lg_merkle_nodes`, the root of
every perfect subtree of `STORED_LEVEL` levels or more, keyed by `level * 2**48 + index`
(the subtree (level, index) holds leaves index * 2**level up to (index + 1) * 2**level -
1). Any range a root or a proof needs is a few such subtrees (`merkle.perfect_subtrees`);
a smaller one is hashed from its leaves (at most 2**(STORED_LEVEL - 1)), so a root over
a million leaves is a few dozen rows and a proof under a hundred, read by primary key in
two statements. Not storing the lowest levels saves most node rows (one per leaf when
every level is kept, one per 2**(STORED_LEVEL - 1) leaves here), which is most of the
cost of keeping the tree.

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

import hashlib
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
STORED_LEVEL = 4  # perfect subtrees below this level are hashed from their leaves
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
    """The roots of some perfect subtrees, (level, index) -> hash; level 0 are leaf
    hashes. Two statements, whatever their number (the keys are primary keys): the stored
    nodes, and the leaves of the rest (below `STORED_LEVEL`), hashed here."""
    keys = set(wanted)
    small = [(lv, i) for lv, i in keys if 0 < lv < STORED_LEVEL]
    leaves = sorted(
        {i for lv, i in keys if lv == 0}
        | {j for lv, i in small for j in range(i << lv, (i + 1) << lv)}
    )
    nodes = sorted(node_key(lv, i) for lv, i in keys if lv >= STORED_LEVEL)
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
    for lv, i in small:
        below = [out.get((0, j)) for j in range(i << lv, (i + 1) << lv)]
        if all(h is not None for h in below):
            out[(lv, i)] = M.root([h for h in below if h is not None])
    missing = keys - out.keys()
    if missing:
        raise InvariantViolated(
            f"the stored Merkle tree lacks {len(missing)} subtree(s), e.g. {min(missing)}: "
            "its tables were changed behind the ledger's back",
            kind="merkle_tree",
        )
    return out


def _grow(frontier: M.Frontier, data: Sequence[bytes], nodes: list[tuple[int, bytes]]) -> None:
    """Append leaves (their data) to `frontier`, adding to `nodes` the (key, hash) of each
    perfect subtree they complete at `STORED_LEVEL` or above: `Frontier.append` inlined,
    as this loop is the tree's whole per-event cost in Python."""
    sha = hashlib.sha256
    stack, size = frontier.nodes, frontier.size
    push, pop, made = stack.append, stack.pop, nodes.append
    for d in data:
        node = sha(b"\x00" + d).digest()
        carry, level = size, 0
        while carry & 1:
            node = sha(b"\x01" + pop() + node).digest()
            carry >>= 1
            level += 1
            if level >= STORED_LEVEL:
                made(((level << LEVEL_SHIFT) + (size >> level), node))
        push(node)
        size += 1
    frontier.size = size


def _store(
    tx: Tx,
    first: int,
    positions: Sequence[int],
    data: Sequence[bytes],
    nodes: Sequence[tuple[int, bytes]],
) -> None:
    """Insert a page of leaves (indexes from `first`) and nodes, one statement each: the
    keys as one list (PostgreSQL: comma-separated text; SQLite: a JSON array), the hashes
    as one byte string of 32 bytes each (a list of byte strings costs the client a
    quoting pass per element)."""
    pg = tx.store.dialect == "postgres"
    if positions:
        blob = b"".join(data)
        if len(blob) != M.HASH_SIZE * len(positions):
            raise ValueError("every leaf's data is 32 bytes")
        keys = ",".join(map(str, positions))
        tx.execute(
            STATEMENTS.sql(tx, "pg_tree_insert_leaves" if pg else "sqlite_tree_insert_leaves"),
            (first, blob, keys if pg else f"[{keys}]"),
        )
    if nodes:
        keys = ",".join(str(k) for k, _h in nodes)
        tx.execute(
            STATEMENTS.sql(tx, "pg_tree_insert_nodes" if pg else "sqlite_tree_insert_nodes"),
            (b"".join(h for _k, h in nodes), keys if pg else f"[{keys}]"),
        )


def _page_data(tx: Tx, rows: Sequence[Sequence[Any]]) -> list[bytes]:
    """The leaf data of a page of `tree_new_leaves` rows (leaves.leaf_data_of): the
    chain hash's bytes; an event without one is read again for its content."""
    out: list[bytes | None] = []
    unchained: list[int] = []
    fromhex = bytes.fromhex
    for i, (_position, hx) in enumerate(rows):
        if hx is not None and len(hx) == 64:
            try:
                out.append(fromhex(hx))
                continue
            except ValueError:
                pass
        if hx is None:
            unchained.append(i)
            out.append(None)
        else:
            out.append(leaf_data_of(hx, None, 0, "", b""))
    for i in range(0, len(unchained), _CHUNK):
        part = unchained[i : i + _CHUNK]
        got = {
            int(r[0]): leaf_data_of(None, r[1], int(r[2]), r[3], r[4])
            for r in tx.fetch_rows(
                STATEMENTS.sql(tx, "tree_unchained_events"),
                (tx_list(tx, [int(rows[j][0]) for j in part]),),
            )
        }
        for j in part:
            out[j] = got[int(rows[j][0])]
    return [d for d in out if d is not None]


def _frontier(tx: Tx) -> tuple[M.Frontier, int]:
    """The stored tree's right edge and its last leaf's position."""
    n, after = last_leaf(tx)
    keys = M.perfect_subtrees(0, n)
    have = subtrees(tx, keys)
    return M.Frontier.of(n, [have[k] for k in keys]), after


def extend(tx: Tx) -> int:
    """Add the events above the last leaf, up to the feed's horizon, as leaves (and the
    subtrees they complete); returns the tree's size. Call in a write transaction.

    Set-based: per page of `PAGE` events one read of their chain hashes, the leaf and
    subtree hashes computed here, one insert of the leaves and one of the nodes."""
    if tx.store.dialect == "postgres":
        tx.execute(STATEMENTS.sql(tx, "tree_lock"), (TREE_LOCK,))
    frontier, after = _frontier(tx)
    upto = horizon(tx)  # a statement of its own, before the reads
    sql = STATEMENTS.sql(tx, "tree_new_leaves")
    while after < upto:
        rows = tx.fetch_rows(sql, (after, upto, PAGE))
        if not rows:
            break
        positions = [int(r[0]) for r in rows]
        data = _page_data(tx, rows)
        first = frontier.size
        nodes: list[tuple[int, bytes]] = []
        _grow(frontier, data, nodes)
        _store(tx, first, positions, data, nodes)
        after = positions[-1]
        if len(rows) < PAGE:
            break
    return frontier.size


def load(tx: Tx, rows: Iterable[tuple[int, bytes]]) -> int:
    """Append leaves given as (position, data), positions above the last leaf's, with
    their subtrees, in pages (bulk set-up: the bench, a copy); returns the size."""
    frontier, _after = _frontier(tx)
    positions: list[int] = []
    data: list[bytes] = []

    def flush() -> None:
        nodes: list[tuple[int, bytes]] = []
        first = frontier.size
        _grow(frontier, data, nodes)
        _store(tx, first, positions, data, nodes)
        positions.clear()
        data.clear()

    for position, d in rows:
        positions.append(position)
        data.append(d)
        if len(positions) >= PAGE:
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
