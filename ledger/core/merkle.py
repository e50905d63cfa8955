"""The Merkle tree of RFC 9162 section 2.1 (Certificate Transparency 2.0), pure: no I/O.

A leaf's hash is `SHA-256(0x00 || data)`, an interior node's `SHA-256(0x01 || left ||
right)`; the tree over n leaves splits at the largest power of two below n (section
2.1.1), and the empty tree's hash is SHA-256 of nothing.

Every function below but `leaf_hash` takes the leaves as their *leaf hashes* (32 bytes
each, `leaf_hash(data)`), so a caller hashes each leaf once. Proofs are lists of 32-byte
hashes, in the order of sections 2.1.3.1 (inclusion) and 2.1.4.1 (consistency); their
checks are the algorithms of sections 2.1.3.2 and 2.1.4.2, which need no leaf but the
one proved. `Frontier` keeps the tree's right edge (one hash per set bit of its size) so
a root grows with each appended leaf in O(log n) memory.

The ledger's leaves are its events in position order (`ledger/service/checkpoints.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """`SHA-256(0x00 || data)`."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """`SHA-256(0x01 || left || right)`."""
    return hashlib.sha256(b"\x01" + left + right).digest()


class Frontier:
    """The right edge of a tree grown leaf by leaf: the roots of its perfect subtrees, one
    per set bit of its size, largest (leftmost) first: a compact range from 0 to `size`."""

    __slots__ = ("nodes", "size")

    def __init__(self) -> None:
        self.size = 0
        self.nodes: list[bytes] = []

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash at the right: merge equal-sized subtrees as a binary counter
        carries. Returns the perfect subtrees this completed above the leaf, as (level,
        index, hash) (see `perfect_subtrees`), for a caller that stores them."""
        node, size, level = leaf, self.size, 0
        made: list[tuple[int, int, bytes]] = []
        while size & 1:
            node = node_hash(self.nodes.pop(), node)
            size >>= 1
            level += 1
            made.append((level, self.size >> level, node))
        self.nodes.append(node)
        self.size += 1
        return made

    @classmethod
    def of(cls, size: int, nodes: Sequence[bytes]) -> Frontier:
        """The frontier of a tree of `size` leaves from its perfect subtrees' roots
        (`perfect_subtrees(0, size)`, left to right)."""
        if len(nodes) != size.bit_count():
            raise ValueError(f"a tree of {size} leaves has {size.bit_count()} frontier nodes")
        f = cls()
        f.size, f.nodes = size, list(nodes)
        return f

    def extend(self, leaves: Sequence[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        """The tree's hash: the subtrees folded from the right (RFC 9162's split puts the
        largest perfect subtree on the left at every level)."""
        if not self.nodes:
            return EMPTY_ROOT
        out = self.nodes[-1]
        for node in reversed(self.nodes[:-1]):
            out = node_hash(node, out)
        return out


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of the given leaf hashes."""
    f = Frontier()
    f.extend(leaves)
    return f.root()


def _range_root(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    f = Frontier()
    for i in range(lo, hi):
        f.append(leaves[i])
    return f.root()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_size(size: int, leaves: Sequence[bytes]) -> None:
    if size < 0 or size > len(leaves):
        raise ValueError(f"tree size {size} is not between 0 and {len(leaves)}")


RangeRoot = Callable[[int, int], bytes]
"""`range_root(lo, hi)`: MTH of leaves lo..hi-1 taken as a tree of their own."""


def _list_range_root(leaves: Sequence[bytes]) -> RangeRoot:
    return lambda lo, hi: _range_root(leaves, lo, hi)


def inclusion_proof(index: int, size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, D[size]) (section 2.1.3.1): the hashes that take leaf `index` of the
    tree of the first `size` leaves to its root."""
    _check_size(size, leaves)
    return inclusion_path(index, size, _list_range_root(leaves))


def inclusion_path(index: int, size: int, range_root: RangeRoot) -> list[bytes]:
    """`inclusion_proof` with the subtrees' roots from `range_root` (stored subtree hashes:
    ledger/stores/tree.py). Every range asked for starts at a multiple of a power of two at
    least its length, so it is a few aligned perfect subtrees."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of {size} leaves")
    out: list[bytes] = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:  # walk down from the root; siblings are collected leaf-side first
        k = _split(hi - lo)
        if m < k:
            out.append(range_root(lo + k, hi))
            hi = lo + k
        else:
            out.append(range_root(lo, lo + k))
            lo, m = lo + k, m - k
    out.reverse()
    return out


def consistency_proof(first: int, second: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(first, D[second]) (section 2.1.4.1): the hashes that show the tree of the first
    `first` leaves is a prefix of the tree of the first `second`. Empty when `first` is 0
    or equals `second`."""
    _check_size(second, leaves)
    return consistency_path(first, second, _list_range_root(leaves))


def consistency_path(first: int, second: int, range_root: RangeRoot) -> list[bytes]:
    """`consistency_proof` with the subtrees' roots from `range_root`."""
    if not 0 <= first <= second:
        raise ValueError(f"tree size {first} is not between 0 and {second}")
    if first == 0 or first == second:
        return []
    out: list[bytes] = []
    lo, hi, m, whole = 0, second, first, True
    while True:  # SUBPROOF(m, D[lo:hi], whole), iteratively
        n = hi - lo
        if m == n:
            if not whole:
                out.append(range_root(lo, hi))
            break
        k = _split(n)
        if m <= k:
            out.append(range_root(lo + k, hi))
            hi = lo + k
        else:
            out.append(range_root(lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    out.reverse()
    return out


def perfect_subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """The aligned perfect subtrees that make up leaves lo..hi-1, left to right, as
    (level, index): the subtree (level, index) holds leaves index * 2**level up to
    (index + 1) * 2**level - 1. Their roots folded from the right are the range's root."""
    out: list[tuple[int, int]] = []
    while lo < hi:
        level = (lo & -lo).bit_length() - 1 if lo else (hi - lo).bit_length() - 1
        while lo + (1 << level) > hi:
            level -= 1
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def fold(nodes: Sequence[bytes]) -> bytes:
    """The root of a range from its perfect subtrees' roots (left to right)."""
    if not nodes:
        return EMPTY_ROOT
    out = nodes[-1]
    for node in reversed(nodes[:-1]):
        out = node_hash(node, out)
    return out


def _ok_hash(h: object) -> bool:
    return isinstance(h, bytes) and len(h) == HASH_SIZE


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root_hash: bytes
) -> bool:
    """Section 2.1.3.2: does `proof` take leaf hash `leaf` at `index` to `root_hash`, the
    root of a tree of `size` leaves?"""
    if not (_ok_hash(leaf) and _ok_hash(root_hash) and all(_ok_hash(p) for p in proof)):
        return False
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root_hash


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Section 2.1.4.2: does `proof` show the tree of `first` leaves with root `first_root`
    is a prefix of the tree of `second` leaves with root `second_root`? Any tree extends
    the empty one (size 0, an empty proof)."""
    if not (_ok_hash(first_root) and _ok_hash(second_root) and all(_ok_hash(p) for p in proof)):
        return False
    if not 0 <= first <= second:
        return False
    if first == 0:
        return not proof and first_root == EMPTY_ROOT
    if first == second:
        return not proof and first_root == second_root
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of two: the first tree is a subtree
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == first_root and sr == second_root and sn == 0
