"""ledger/core/merkle.py: the RFC 9162 Merkle tree against the RFC 6962 test vectors and an
independent reference (the recursive definitions of RFC 9162 section 2.1, written here).

The vectors are the well-known ones of Certificate Transparency (certificate-transparency-go
and transparency-dev/merkle `testonly` constants, repeated in many ports): eight leaves,
the root at each size 0..8, two inclusion proofs in the tree of 8 and three consistency
proofs.
"""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.core import merkle as M

DATA = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = [
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]
CONSISTENCY = [
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        8,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
]
LEAVES = [M.leaf_hash(d) for d in DATA]


# ---- the reference: RFC 9162 section 2.1's recursive definitions, independently -------------
def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def ref_mth(data: list[bytes]) -> bytes:
    n = len(data)
    if n == 0:
        return _sha(b"")
    if n == 1:
        return _sha(b"\x00" + data[0])
    k = 1
    while k * 2 < n:
        k *= 2
    return _sha(b"\x01" + ref_mth(data[:k]) + ref_mth(data[k:]))


def ref_path(m: int, data: list[bytes]) -> list[bytes]:
    n = len(data)
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return [*ref_path(m, data[:k]), ref_mth(data[k:])]
    return [*ref_path(m - k, data[k:]), ref_mth(data[:k])]


def ref_subproof(m: int, data: list[bytes], b: bool) -> list[bytes]:
    n = len(data)
    if m == n:
        return [] if b else [ref_mth(data)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return [*ref_subproof(m, data[:k], b), ref_mth(data[k:])]
    return [*ref_subproof(m - k, data[k:], False), ref_mth(data[:k])]


def ref_consistency(m: int, data: list[bytes]) -> list[bytes]:
    return [] if m in (0, len(data)) else ref_subproof(m, data, True)


# ---- the vectors -------------------------------------------------------------------------------
def test_roots_match_the_rfc6962_vectors_at_every_size() -> None:
    for n in range(9):
        assert M.root(LEAVES[:n]).hex() == ROOTS[n], n
        f = M.Frontier()
        f.extend(LEAVES[:n])
        assert f.root().hex() == ROOTS[n] and f.size == n


def test_inclusion_proofs_match_the_vectors() -> None:
    for index, size, proof in INCLUSION:
        got = M.inclusion_proof(index, size, LEAVES)
        assert [p.hex() for p in got] == proof
        assert M.verify_inclusion(LEAVES[index], index, size, got, bytes.fromhex(ROOTS[size]))


def test_consistency_proofs_match_the_vectors() -> None:
    for first, second, proof in CONSISTENCY:
        got = M.consistency_proof(first, second, LEAVES)
        assert [p.hex() for p in got] == proof
        assert M.verify_consistency(
            first, second, bytes.fromhex(ROOTS[first]), bytes.fromhex(ROOTS[second]), got
        )


def test_degenerate_consistency() -> None:
    r4, r8 = bytes.fromhex(ROOTS[4]), bytes.fromhex(ROOTS[8])
    assert M.verify_consistency(4, 4, r4, r4, [])
    assert not M.verify_consistency(4, 4, r4, r8, [])
    assert not M.verify_consistency(4, 4, r4, r4, [r4])
    assert M.verify_consistency(0, 8, M.EMPTY_ROOT, r8, [])
    assert not M.verify_consistency(0, 8, r4, r8, [])
    assert not M.verify_consistency(4, 8, r4, r8, [])
    assert not M.verify_consistency(8, 4, r8, r4, [])


# ---- properties against the reference ------------------------------------------------------------
# distinct leaves: with repeated leaves, a proof for a wrong index or size can hash to the
# same root (the same hashes in the same shape), which is no failure of the algorithms
leaf_data = st.lists(st.binary(max_size=12), min_size=1, max_size=40, unique=True)


@settings(max_examples=150, deadline=None)
@given(data=leaf_data, pick=st.integers(min_value=0), other=st.integers(min_value=0))
def test_every_inclusion_proof_verifies_and_fails_when_anything_is_wrong(
    data: list[bytes], pick: int, other: int
) -> None:
    leaves = [M.leaf_hash(d) for d in data]
    n = len(data)
    root = M.root(leaves)
    assert root == ref_mth(data)
    size = 1 + other % n
    index = pick % size
    proof = M.inclusion_proof(index, size, leaves)
    assert proof == ref_path(index, data[:size])
    r = M.root(leaves[:size])
    assert M.verify_inclusion(leaves[index], index, size, proof, r)
    wrong_leaf = M.leaf_hash(data[index] + b"!")
    assert not M.verify_inclusion(wrong_leaf, index, size, proof, r)
    if size > 1:
        assert not M.verify_inclusion(leaves[index], (index + 1) % size, size, proof, r)
    # a wrong size: one whose paths are longer (a size with paths of the same shape, as 3
    # and 4 for leaf 0, cannot be told apart by the algorithm, by design)
    assert not M.verify_inclusion(leaves[index], index, size * 4, proof, r)
    assert not M.verify_inclusion(leaves[index], index, size, proof, _sha(r))
    assert not M.verify_inclusion(leaves[index], index, index, proof, r)
    if proof:
        assert not M.verify_inclusion(leaves[index], index, size, proof[:-1], r)
        assert not M.verify_inclusion(leaves[index], index, size, [*proof, r], r)


@settings(max_examples=150, deadline=None)
@given(data=leaf_data, a=st.integers(min_value=0), b=st.integers(min_value=0))
def test_every_consistency_proof_verifies_and_fails_when_anything_is_wrong(
    data: list[bytes], a: int, b: int
) -> None:
    leaves = [M.leaf_hash(d) for d in data]
    n = len(data)
    second = b % (n + 1)
    first = a % (second + 1)
    proof = M.consistency_proof(first, second, leaves)
    assert proof == ref_consistency(first, data[:second])
    r1, r2 = ref_mth(data[:first]), ref_mth(data[:second])
    assert M.verify_consistency(first, second, r1, r2, proof)
    assert not M.verify_consistency(first, second, _sha(r1), r2, proof)
    if first:  # any tree extends the empty one
        assert not M.verify_consistency(first, second, r1, _sha(r2), proof)
    if 0 < first < second:
        assert not M.verify_consistency(first, second, r1, r2, proof[:-1])
        assert not M.verify_consistency(first, second, r1, r2, [*proof, r1])
        assert not M.verify_consistency(first, second * 4, r1, r2, proof)
        # a history rewritten below `first`: the old root is not a prefix of the new tree
        edited = [data[0] + b"x", *data[1:]]
        assert not M.verify_consistency(first, second, r1, ref_mth(edited[:second]), proof)


def test_frontier_matches_the_reference_at_every_size() -> None:
    data = [i.to_bytes(2, "big") for i in range(70)]
    f = M.Frontier()
    for n, d in enumerate(data, start=1):
        f.append(M.leaf_hash(d))
        assert f.root() == ref_mth(data[:n])
        assert len(f.nodes) == bin(n).count("1")


def test_bad_arguments_are_refused() -> None:
    import pytest

    with pytest.raises(ValueError):
        M.inclusion_proof(8, 8, LEAVES)
    with pytest.raises(ValueError):
        M.inclusion_proof(0, 9, LEAVES)
    with pytest.raises(ValueError):
        M.consistency_proof(5, 3, LEAVES)
    r8 = bytes.fromhex(ROOTS[8])
    proof = M.inclusion_proof(5, 8, LEAVES)
    assert not M.verify_inclusion(LEAVES[5][:31], 5, 8, proof, r8)
    assert not M.verify_inclusion(LEAVES[5], -1, 8, proof, r8)
    assert not M.verify_inclusion(LEAVES[5], 8, 8, proof, r8)
