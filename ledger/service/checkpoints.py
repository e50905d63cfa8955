"""Signed checkpoints of the ledger's Merkle tree, and proofs against them.

The hash chains and `verify` catch an event edited behind the ledger's back, not whoever
controls the database: they can rewrite an event and recompute every later hash, replace
the ledger, or delete its newest events. A *checkpoint* (C2SP tlog-checkpoint,
ledger/core/note.py) is the tree's size and root hash signed with a key kept outside the
database; shipped elsewhere (a witness, a ticket, a mail), it pins the first `size`
events: `verify(checkpoints=..., vkeys=...)` recomputes the tree at that size and refuses
a ledger whose root differs (`checkpoint_rewritten`), that has fewer events
(`checkpoint_truncated`), or a checkpoint whose signature does not verify
(`checkpoint_forged`) or is by no given key (`checkpoint_unknown_key`).

The tree (ledger/core/merkle.py) is computed on demand from the events table in one
pass (ledger/stores/leaves.py: a statement per 20,000 events), O(n) hashes; no table of
its own. Its leaves are the events in position order; archiving a run deletes its events,
so a checkpoint signed before an archive reports the history rewritten.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledger.core import merkle as M
from ledger.core.errors import InvalidInput
from ledger.core.note import (
    Checkpoint,
    NoteError,
    Signer,
    UnverifiedNote,
    Verifier,
    open_checkpoint,
    sign_checkpoint,
)
from ledger.stores.leaves import iter_leaves

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

ORIGIN_PREFIX = "run-ledger/"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@dataclass(frozen=True)
class TreeHead:
    """The tree over the ledger's readable events: its size (leaves) and root hash."""

    size: int
    root: bytes
    first_leaf: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "root": _b64(self.root)}


def _leaves(lg: Ledger, limit: int | None = None) -> list[bytes]:
    with lg.store.read() as tx:
        return [h for _p, h in iter_leaves(tx, limit)]


def tree_head(lg: Ledger) -> TreeHead:
    """The size and root of the tree over every readable event (one pass, a frontier)."""
    f = M.Frontier()
    first: bytes | None = None
    with lg.store.read() as tx:
        for _p, h in iter_leaves(tx):
            if first is None:
                first = h
            f.append(h)
    return TreeHead(f.size, f.root(), first)


def default_origin(head: TreeHead) -> str:
    """`run-ledger/` and the first 16 hex digits of the first leaf's hash: stable for the
    ledger's life (its first event never changes but by a rewrite)."""
    return ORIGIN_PREFIX + (head.first_leaf.hex()[:16] if head.first_leaf else "empty")


def checkpoint(lg: Ledger, origin: str | None = None) -> Checkpoint:
    """The unsigned checkpoint of the tree now."""
    head = tree_head(lg)
    return Checkpoint(origin or default_origin(head), head.size, head.root)


def sign(lg: Ledger, signer_key: str, origin: str | None = None) -> str:
    """The signed checkpoint (note text) of the tree now, signed with `signer_key` (the text
    of a private key file). The key is used here and never stored."""
    return sign_checkpoint(checkpoint(lg, origin), Signer.parse(signer_key))


def _size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{what} must be a non-negative integer, not {value!r}")
    return value


def inclusion(lg: Ledger, index: int, size: int) -> dict[str, Any]:
    """The proof that leaf `index` is in the tree of the first `size` leaves."""
    index, size = _size(index, "index"), _size(size, "size")
    if index >= size:
        raise InvalidInput(f"index {index} is not below size {size}")
    leaves = _leaves(lg, size)
    if len(leaves) < size:
        raise InvalidInput(f"the ledger has {len(leaves)} events, fewer than size {size}")
    return {
        "type": "inclusion",
        "index": index,
        "size": size,
        "leaf_hash": _b64(leaves[index]),
        "root": _b64(M.root(leaves)),
        "proof": [_b64(p) for p in M.inclusion_proof(index, size, leaves)],
    }


def consistency(lg: Ledger, first: int, second: int) -> dict[str, Any]:
    """The proof that the tree of `first` leaves is a prefix of the tree of `second`."""
    first, second = _size(first, "from"), _size(second, "to")
    if first > second:
        raise InvalidInput(f"from {first} is above to {second}")
    leaves = _leaves(lg, second)
    if len(leaves) < second:
        raise InvalidInput(f"the ledger has {len(leaves)} events, fewer than size {second}")
    return {
        "type": "consistency",
        "from": first,
        "to": second,
        "from_root": _b64(M.root(leaves[:first])),
        "to_root": _b64(M.root(leaves)),
        "proof": [_b64(p) for p in M.consistency_proof(first, second, leaves)],
    }


# ---- checking -----------------------------------------------------------------------------------
def _problem(kind: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "run_id": None, "position": None, "detail": detail, **extra}


def parse_verifiers(vkeys: Sequence[str]) -> list[Verifier]:
    if (
        isinstance(vkeys, str)
        or not isinstance(vkeys, Sequence)
        or not all(isinstance(v, str) for v in vkeys)
    ):
        raise InvalidInput("vkeys must be a list of verifier keys (text)")
    if not vkeys:
        raise InvalidInput("checking checkpoints needs at least one verifier key")
    return [Verifier.parse(v) for v in vkeys]


def check_checkpoints(
    lg: Ledger, checkpoints: Sequence[str], vkeys: Sequence[str]
) -> list[dict[str, Any]]:
    """Problems (verify's shape) of the ledger against signed checkpoints: each must be
    signed by one of `vkeys`, and the ledger's tree at its size must have its root."""
    if isinstance(checkpoints, str) or not all(isinstance(c, str) for c in checkpoints):
        raise InvalidInput("checkpoints must be a list of signed checkpoint texts")
    verifiers = parse_verifiers(vkeys)
    problems: list[dict[str, Any]] = []
    wanted: list[tuple[int, Checkpoint]] = []
    for i, text in enumerate(checkpoints):
        try:
            cp, _good = open_checkpoint(text, verifiers)
        except UnverifiedNote as e:
            problems.append(
                _problem("checkpoint_" + e.kind, f"checkpoint {i + 1}: {e}", checkpoint=i)
            )
            continue
        except NoteError as e:
            problems.append(
                _problem("checkpoint_forged", f"checkpoint {i + 1} is malformed: {e}", checkpoint=i)
            )
            continue
        wanted.append((i, cp))
    if not wanted:
        return problems
    sizes = {cp.size for _i, cp in wanted}
    roots: dict[int, bytes] = {}
    f = M.Frontier()
    if 0 in sizes:
        roots[0] = f.root()
    with lg.store.read() as tx:
        for _p, h in iter_leaves(tx, max(sizes)):
            f.append(h)
            if f.size in sizes:
                roots[f.size] = f.root()
    for i, cp in wanted:
        where = {"checkpoint": i, "origin": cp.origin, "size": cp.size}
        if cp.size not in roots:
            problems.append(
                _problem(
                    "checkpoint_truncated",
                    f"checkpoint {i + 1} ({cp.origin}) was signed over {cp.size} events; the "
                    f"ledger has {f.size}: its newest events were deleted",
                    **where,
                )
            )
        elif roots[cp.size] != cp.root:
            problems.append(
                _problem(
                    "checkpoint_rewritten",
                    f"checkpoint {i + 1} ({cp.origin}) signed root {_b64(cp.root)} over the "
                    f"first {cp.size} events; the ledger's is {_b64(roots[cp.size])}: its "
                    "history was rewritten or replaced",
                    **where,
                )
            )
    return problems


def check_proof(
    proof: dict[str, Any] | str, signed: Sequence[str], vkeys: Sequence[str]
) -> dict[str, Any]:
    """Offline: does `proof` (inclusion or consistency, as `inclusion`/`consistency` give
    it) hold against signed checkpoints? An inclusion proof needs a checkpoint of its size; a
    consistency proof one of its `to` size, and its `from` root is checked against a
    checkpoint of that size when one is given. Returns {"ok", "detail"}."""
    if isinstance(proof, str):
        try:
            proof = json.loads(proof)
        except ValueError:
            raise InvalidInput("the proof is not JSON") from None
    if not isinstance(proof, dict):
        raise InvalidInput("a proof is a JSON object")
    if isinstance(signed, str):
        signed = [signed]
    verifiers = parse_verifiers(vkeys)
    by_size: dict[int, Checkpoint] = {}
    for text in signed:
        cp, _good = open_checkpoint(text, verifiers)
        by_size[cp.size] = cp

    def hashes(key: str) -> list[bytes]:
        value = proof.get(key)
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InvalidInput(f"the proof's {key} must be a list of base64 hashes")
        return [base64.b64decode(x) for x in value]

    def one(key: str) -> bytes:
        value = proof.get(key)
        if not isinstance(value, str):
            raise InvalidInput(f"the proof's {key} must be a base64 hash")
        return base64.b64decode(value)

    def signed_at(size: int) -> Checkpoint:
        if size not in by_size:
            have = ", ".join(str(s) for s in sorted(by_size)) or "none"
            raise InvalidInput(f"no given checkpoint has size {size} (sizes: {have})")
        return by_size[size]

    kind = proof.get("type")
    if kind == "inclusion":
        size, index = _size(proof.get("size"), "size"), _size(proof.get("index"), "index")
        cp = signed_at(size)
        ok = M.verify_inclusion(one("leaf_hash"), index, size, hashes("proof"), cp.root)
        what = f"leaf {index} in the tree of {size}"
    elif kind == "consistency":
        first, second = _size(proof.get("from"), "from"), _size(proof.get("to"), "to")
        cp = signed_at(second)
        from_root = one("from_root")
        old = by_size.get(first)
        ok = (old is None or old.root == from_root) and M.verify_consistency(
            first, second, from_root, cp.root, hashes("proof")
        )
        what = f"the tree of {first} ({'signed' if old else 'root as the proof says'}) as a prefix of the tree of {second}"
    else:
        raise InvalidInput("a proof's type is inclusion or consistency")
    return {
        "ok": ok,
        "detail": f"{what}: {'proved' if ok else 'NOT proved'} against {cp.origin}'s signed root",
    }
