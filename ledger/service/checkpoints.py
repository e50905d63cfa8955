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

The tree (ledger/core/merkle.py) is kept in the database (ledger/stores/tree.py): every
call here first extends it with the events the change feed may read, then reads a root
or a proof from its stored subtrees, a few rows whatever the size. Its leaves are the
events in position order; archiving a run deletes its events but not their leaves, so a
checkpoint signed before an archive still verifies and an archived event is still
provable.
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
from ledger.stores import tree as T

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

ORIGIN_PREFIX = "run-ledger/"


def b64(b: bytes) -> str:
    """Base64 text of a hash, as in every proof document."""
    return base64.b64encode(b).decode()


_b64 = b64


@dataclass(frozen=True)
class TreeHead:
    """The tree over the ledger's readable events: its size (leaves) and root hash."""

    size: int
    root: bytes
    first_leaf: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "root": _b64(self.root)}


def extend(lg: Ledger) -> int:
    """Bring the stored tree up to the change feed's horizon; returns its size."""
    with lg.store.write() as tx:
        return T.extend(tx)


def tree_head(lg: Ledger) -> TreeHead:
    """The size and root of the tree over every readable event."""
    size = extend(lg)
    with lg.store.read() as tx:
        first = T.subtrees(tx, [(0, 0)])[(0, 0)] if size else None
        return TreeHead(size, T.root(tx, size), first)


def default_origin(head: TreeHead) -> str:
    """`run-ledger/` and the first 16 hex digits of the first leaf's hash: stable for the
    ledger's life (its first event never changes but by a rewrite)."""
    return ORIGIN_PREFIX + (head.first_leaf.hex()[:16] if head.first_leaf else "empty")


def checkpoint(lg: Ledger, origin: str | None = None) -> Checkpoint:
    """The unsigned checkpoint of the tree now."""
    head = tree_head(lg)
    return Checkpoint(origin or default_origin(head), head.size, head.root)


def sign_with(cp: Checkpoint, signer: Signer) -> str:
    """The signed note of a checkpoint."""
    return sign_checkpoint(cp, signer)


def sign(lg: Ledger, signer_key: str, origin: str | None = None) -> str:
    """The signed checkpoint (note text) of the tree now, signed with `signer_key` (the text
    of a private key file). The key is used here and never stored."""
    return sign_checkpoint(checkpoint(lg, origin), Signer.parse(signer_key))


def _size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{what} must be a non-negative integer, not {value!r}")
    return value


def _within(lg: Ledger, size: int) -> None:
    have = extend(lg)
    if size > have:
        raise InvalidInput(f"the ledger's tree has {have} events, fewer than size {size}")


def inclusion(lg: Ledger, index: int, size: int) -> dict[str, Any]:
    """The proof that leaf `index` is in the tree of the first `size` leaves."""
    index, size = _size(index, "index"), _size(size, "size")
    if index >= size:
        raise InvalidInput(f"index {index} is not below size {size}")
    _within(lg, size)
    with lg.store.read() as tx:
        leaf, root, proof = T.inclusion(tx, index, size)
    return _inclusion_doc(index, size, leaf, root, proof)


def _inclusion_doc(
    index: int, size: int, leaf: bytes, root: bytes, proof: Sequence[bytes]
) -> dict[str, Any]:
    return {
        "type": "inclusion",
        "leaf_index": index,
        "tree_size": size,
        "leaf_hash": _b64(leaf),
        "root": _b64(root),
        "hashes": [_b64(p) for p in proof],
    }


def consistency(lg: Ledger, first: int, second: int) -> dict[str, Any]:
    """The proof that the tree of `first` leaves is a prefix of the tree of `second`."""
    first, second = _size(first, "from"), _size(second, "to")
    if first > second:
        raise InvalidInput(f"from {first} is above to {second}")
    _within(lg, second)
    with lg.store.read() as tx:
        from_root, to_root, proof = T.consistency(tx, first, second)
    return {
        "type": "consistency",
        "size1": first,
        "size2": second,
        "root1": _b64(from_root),
        "root2": _b64(to_root),
        "hashes": [_b64(p) for p in proof],
    }


def run_proof(lg: Ledger, run_id: str, size: int | None = None) -> dict[str, Any]:
    """The run's stored events (its own stream's and each item's) with their leaf indexes
    and inclusion proofs in the tree of the first `size` leaves (default: the tree now).
    Each event carries its chain hash (`hash`, the leaf's data, as in its export line), so
    a third party can tie a proof to the event. Events that are not leaves of that tree
    (newer than `size`) are listed in `not_in_tree`."""
    from ledger.stores.raw import read_stream_events
    from ledger.transfer.exports import streams_of_runs

    run_id = lg.resolve_run_id(run_id)
    have = extend(lg)
    size = have if size is None else _size(size, "size")
    if size > have:
        raise InvalidInput(f"the ledger's tree has {have} events, fewer than size {size}")
    streams = streams_of_runs(lg, [run_id])
    with lg.store.read() as tx:
        events = sorted(
            (e for stream in sorted(streams) for e in read_stream_events(tx, stream)),
            key=lambda e: e.position,
        )
        leaves = T.leaves_at(tx, [e.position for e in events])
        inside = [e for e in events if e.position in leaves and leaves[e.position][0] < size]
        root, proofs = T.inclusions(tx, [leaves[e.position][0] for e in inside], size)
    docs = []
    for e, (leaf, proof) in zip(inside, proofs, strict=True):
        index, data, _gone = leaves[e.position]
        docs.append(
            {
                "position": e.position,
                "stream": str(e.stream),
                "version": e.version,
                "topic": e.topic,
                "hash": data.hex(),
                "leaf_index": index,
                "leaf_hash": b64(leaf),
                "hashes": [b64(p) for p in proof],
            }
        )
    return {
        "type": "run",
        "run_id": run_id,
        "tree_size": size,
        "root": b64(root),
        "events": docs,
        "not_in_tree": sorted({e.position for e in events} - {e.position for e in inside}),
    }


# ---- checking -----------------------------------------------------------------------------------
def _problem(kind: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "run_id": None, "position": None, "detail": detail, **extra}


def parse_verifiers(vkeys: Sequence[str]) -> list[Verifier]:
    if isinstance(vkeys, str) or not all(isinstance(v, str) for v in vkeys):
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
    extend(lg)
    differ = 0
    with lg.store.read() as tx:
        for h, changed in T.effective_leaves(tx, max(sizes)):
            differ += changed
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
                    "history was rewritten or replaced"
                    + (
                        f" ({differ} event(s) no longer match their stored leaves)"
                        if differ
                        else ""
                    ),
                    **where,
                )
            )
    return problems


# A proof's fields and the names the first release of `prove` gave them, still accepted.
_OLD_NAMES = {
    "leaf_index": "index",
    "tree_size": "size",
    "hashes": "proof",
    "size1": "from",
    "size2": "to",
    "root1": "from_root",
}


def _field(doc: dict[str, Any], name: str) -> Any:
    """A proof's field by its name, else by its old name (see `_OLD_NAMES`)."""
    if name in doc:
        return doc[name]
    return doc.get(_OLD_NAMES.get(name, name))


def _event_proved(e: dict[str, Any], size: int, root: bytes) -> bool:
    """One event of a run proof: its leaf is SHA-256(0x00 || its chain hash), and the
    proof takes that leaf to the signed root."""
    try:
        leaf = base64.b64decode(e["leaf_hash"], validate=True)
        proof = [base64.b64decode(p, validate=True) for p in _field(e, "hashes")]
        index = _size(_field(e, "leaf_index"), "leaf_index")
        data = bytes.fromhex(e["hash"])
    except (KeyError, TypeError, ValueError, InvalidInput):
        return False
    return leaf == M.leaf_hash(data) and M.verify_inclusion(leaf, index, size, proof, root)


def check_proof(
    proof: dict[str, Any] | str, signed: Sequence[str], vkeys: Sequence[str]
) -> dict[str, Any]:
    """Offline: does `proof` (inclusion, consistency or run, as `inclusion`, `consistency`
    and `run_proof` give it) hold against signed checkpoints? An inclusion or run proof
    needs a checkpoint of its `tree_size`; a consistency proof one of its `size2`, and its
    `root1` is checked against a checkpoint of `size1` when one is given (without
    `root1`, such a checkpoint is needed and gives the older root). The field names
    of the first release (`index`, `size`, `proof`, `from`, `to`, `from_root`) are
    accepted too, and a document without `type` is taken by its fields. Returns
    {"ok", "detail"}."""
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
        value = _field(proof, key)
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InvalidInput(f"the proof's {key} must be a list of base64 hashes")
        try:
            return [base64.b64decode(x, validate=True) for x in value]
        except ValueError:
            raise InvalidInput(f"the proof's {key} must be a list of base64 hashes") from None

    def one(key: str) -> bytes:
        value = _field(proof, key)
        if not isinstance(value, str):
            raise InvalidInput(f"the proof's {key} must be a base64 hash")
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise InvalidInput(f"the proof's {key} must be a base64 hash") from None

    def signed_at(size: int) -> Checkpoint:
        if size not in by_size:
            have = ", ".join(str(s) for s in sorted(by_size)) or "none"
            raise InvalidInput(f"no given checkpoint has size {size} (sizes: {have})")
        return by_size[size]

    kind = proof.get("type")
    if kind is None:
        kind = (
            "run"
            if "events" in proof
            else "consistency"
            if "size1" in proof or "from" in proof
            else "inclusion"
        )
    if kind == "run":
        size = _size(_field(proof, "tree_size"), "tree_size")
        cp = signed_at(size)
        events = proof.get("events")
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise InvalidInput("a run proof's events must be a list of objects")
        bad = [_field(e, "leaf_index") for e in events if not _event_proved(e, size, cp.root)]
        ok = not bad
        what = f"{len(events)} event(s) of run {proof.get('run_id')} in the tree of {size}" + (
            f" (leaves {bad} fail)" if bad else ""
        )
    elif kind == "inclusion":
        size = _size(_field(proof, "tree_size"), "tree_size")
        index = _size(_field(proof, "leaf_index"), "leaf_index")
        cp = signed_at(size)
        ok = M.verify_inclusion(one("leaf_hash"), index, size, hashes("hashes"), cp.root)
        what = f"leaf {index} in the tree of {size}"
    elif kind == "consistency":
        first = _size(_field(proof, "size1"), "size1")
        second = _size(_field(proof, "size2"), "size2")
        cp = signed_at(second)
        old = by_size.get(first)
        # without root1 (the bare RFC shape), the older tree's root is its checkpoint's
        from_root = old.root if old is not None and _field(proof, "root1") is None else one("root1")
        ok = (old is None or old.root == from_root) and M.verify_consistency(
            first, second, from_root, cp.root, hashes("hashes")
        )
        what = f"the tree of {first} ({'signed' if old else 'root as the proof says'}) as a prefix of the tree of {second}"
    else:
        raise InvalidInput("a proof's type is inclusion, consistency or run")
    return {
        "ok": ok,
        "detail": f"{what}: {'proved' if ok else 'NOT proved'} against {cp.origin}'s signed root",
    }
