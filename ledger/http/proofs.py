"""The Merkle tree over HTTP (ledger/service/checkpoints.py): `GET /checkpoint`,
`GET /proofs/inclusion` and `GET /proofs/consistency`, the same JSON documents as
`ledger checkpoint prove`.

Any reader may ask (any token's role, or anyone where reads are public): an auditor
needs no role of the workflow, only a token. Nothing here reveals an event's content:
a leaf hash is SHA-256 over the event's chain hash, itself a hash.

The server signs `GET /checkpoint` only when it was given a key at start
(`ledger serve --checkpoint-key FILE`, or the key's text in `$LEDGER_CHECKPOINT_KEY`);
the key stays in the server's memory, never in the database. Without one it answers the
unsigned tree head: `checkpoint` is null.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.routing import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ledger.http.auth import Reader
from ledger.http.deps import LedgerDep
from ledger.http.errors import error_responses
from ledger.service import checkpoints as C

router = APIRouter(tags=["proofs"], responses=error_responses(401, 422))

MAX_SIZE = 2**62
Size = Annotated[int, Query(ge=0, le=MAX_SIZE)]


class TreeHeadDoc(BaseModel):
    """The tree over the readable events now, signed when the server holds a key."""

    model_config = ConfigDict(frozen=True)
    origin: str = Field(description="The log's name in the checkpoint")
    size: int = Field(description="Leaves (events) in the tree")
    root: str = Field(description="The root hash, base64")
    checkpoint: str | None = Field(
        description="The C2SP signed checkpoint (note text), or null when the server has no key"
    )


class InclusionDoc(BaseModel):
    """An inclusion proof, as `ledger checkpoint prove --index I --size N` prints it."""

    model_config = ConfigDict(frozen=True)
    type: str = Field(description='"inclusion"')
    leaf_index: int = Field(description="The leaf (event) proved, counted from 0")
    tree_size: int = Field(description="Leaves in the tree the proof is against")
    leaf_hash: str = Field(description="SHA-256(0x00 || the event's chain hash), base64")
    root: str = Field(description="The root of the tree of `tree_size` leaves, base64")
    hashes: list[str] = Field(description="The proof's hashes (RFC 9162 2.1.3), base64")


class ConsistencyDoc(BaseModel):
    """A consistency proof, as `ledger checkpoint prove --from N1 --to N2` prints it."""

    model_config = ConfigDict(frozen=True)
    type: str = Field(description='"consistency"')
    size1: int = Field(description="Leaves in the older tree")
    size2: int = Field(description="Leaves in the newer tree")
    root1: str = Field(description="The older tree's root, base64")
    root2: str = Field(description="The newer tree's root, base64")
    hashes: list[str] = Field(description="The proof's hashes (RFC 9162 2.1.4), base64")


@router.get("/checkpoint", response_model=TreeHeadDoc, summary="The latest checkpoint")
def checkpoint(request: Request, reader: Reader, lg: LedgerDep) -> dict[str, Any]:
    """The tree's size and root now, with the checkpoint signed by the server's key (when
    it was given one); check it with `ledger checkpoint check-proof` or `ledger verify
    --checkpoint` and the key's verifier key."""
    del reader
    cp = C.checkpoint(lg)
    signer = getattr(request.app.state, "checkpoint_signer", None)
    note = None if signer is None else C.sign_with(cp, signer)
    return {"origin": cp.origin, "size": cp.size, "root": C.b64(cp.root), "checkpoint": note}


@router.get(
    "/proofs/inclusion",
    response_model=InclusionDoc,
    summary="An inclusion proof: leaf `index` is in the tree of `size` leaves",
)
def inclusion(reader: Reader, lg: LedgerDep, index: Size, size: Size) -> dict[str, Any]:
    """The hashes that take leaf `index` to the root of the tree of the first `size`
    leaves (RFC 9162 section 2.1.3)."""
    del reader
    return C.inclusion(lg, index, size)


@router.get(
    "/proofs/consistency",
    response_model=ConsistencyDoc,
    summary="A consistency proof: the tree of `from` leaves is a prefix of the tree of `to`",
)
def consistency(
    reader: Reader,
    lg: LedgerDep,
    first: Annotated[int, Query(alias="from", ge=0, le=MAX_SIZE)],
    to: Size,
) -> dict[str, Any]:
    """The hashes that show the older tree is a prefix of the newer (RFC 9162 section
    2.1.4)."""
    del reader
    return C.consistency(lg, first, to)
