"""The leaves of the ledger's Merkle tree (ledger/core/merkle.py), read from the events table.

Leaves are the stored events in position order, counted from 0 (a tree's size is a count
of leaves, not a position: PostgreSQL's positions have gaps). Only events at or below the
store's readable position (`Tx.readable_position()`, the change feed's horizon) are
leaves, so a slower writer's commit never lands inside a size already read or signed.

A leaf's data is the 32 bytes of the event's chain hash (the `hash` on its row and in its
export line; ledger/stores/hashchain.py). An event written before the hash chain existed
has none; its leaf data is `SHA-256` over, each preceded by its length (8 bytes,
big-endian): the tag `run-ledger/merkle-leaf/unchained/1`, its stream id, version, topic
and stored bytes (`unchained_leaf`), so it is bound to its content as a chained event is
through its hash. A recorded hash that is not 64 hex digits (a damaged row) is hashed the
same way with the tag `run-ledger/merkle-leaf/odd-hash/1` and the text recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from ledger.core.merkle import leaf_hash
from ledger.stores.base import Tx
from ledger.stores.hashchain import as_uuid
from ledger.stores.raw import max_position
from ledger.stores.sql import STATEMENTS

PAGE = 20_000
_UNCHAINED = b"run-ledger/merkle-leaf/unchained/1"
_ODD = b"run-ledger/merkle-leaf/odd-hash/1"


def _lp(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


def unchained_leaf(stream: UUID, version: int, topic: str, state: bytes) -> bytes:
    """The leaf data of an event that has no recorded hash."""
    return hashlib.sha256(
        _lp(_UNCHAINED, str(stream).encode(), str(version).encode(), topic.encode(), state)
    ).digest()


def leaf_data(row: Any) -> bytes:
    """One leaf's data from a `merkle_leaves` row."""
    return leaf_data_of(row["hash"], row["oid"], int(row["version"]), row["topic"], row["state"])


def leaf_data_of(hx: str | None, oid: Any, version: int, topic: str, state: Any) -> bytes:
    """One leaf's data from an event's recorded hash (or, without one, its content)."""
    if hx is None:
        return unchained_leaf(as_uuid(oid), version, topic, bytes(state or b""))
    if len(hx) == 64:
        try:
            return bytes.fromhex(hx)
        except ValueError:
            pass
    return hashlib.sha256(_lp(_ODD, str(hx).encode())).digest()


def horizon(tx: Tx) -> int:
    """The highest position that may be a leaf now."""
    bound = tx.readable_position()  # a statement of its own, before the reads
    return max_position(tx) if bound is None else bound


def iter_leaves(tx: Tx, limit: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(position, leaf hash) of the first `limit` leaves (all when None), in order: a page
    of `PAGE` events per statement, bounded by one horizon read first."""
    upto = horizon(tx)
    after, left = 0, limit
    sql = STATEMENTS.sql(tx, "merkle_leaves")
    while left is None or left > 0:
        page = PAGE if left is None else min(PAGE, left)
        rows = tx.fetchall(sql, (after, upto, page))
        for r in rows:
            yield int(r["position"]), leaf_hash(leaf_data(r))
        if left is not None:
            left -= len(rows)
        if len(rows) < page:
            return
        after = int(rows[-1]["position"])
