"""Tamper evidence: every stored event carries a hash chaining it to the previous
event of its stream.

    hash(v) = sha256(len-prefixed: tag, hash(v-1), originator id, version, topic, state)

computed over the stored bytes at write time (`Tx.append`, before the insert) and
kept on the event's own row, in the events table's `hash` column (schema version 11;
versions 2-10 kept it in a table of its own, one row per event, `ledger_event_hashes`,
which the migration, stores/migrations/*/0011_*.sql, folds into the events table). The first event of a stream chains
to "" (as does an event whose predecessor was written before the hash chain existed:
see `HASH_CHAIN_FROM`). `projections.verify` recomputes every
chain; a user can record the digest of all stream heads elsewhere to detect a
history rewritten wholesale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from ledger.stores.named import tx_list
from ledger.stores.sql import STATEMENTS

if TYPE_CHECKING:
    from ledger.stores.base import Tx

HASH_COLUMN = "hash"  # on the events table (schema version 11)
LEGACY_HASH_TABLE = "ledger_event_hashes"  # schema versions 2-10
GENESIS = ""
# ledger_meta key: events at or before this position predate the hash chain (schema v2)
HASH_CHAIN_FROM = "hash_chain_from"
_TAG = b"run-ledger/event-hash/1"
_CHUNK = 300


_TAG_PART = len(_TAG).to_bytes(8, "big") + _TAG


def event_hash(prev: str, originator_id: UUID, version: int, topic: str, state: bytes) -> str:
    """The chained hash of one stored event (hex): SHA-256 over the parts, each preceded
    by its length (8 bytes, big-endian), fed as one buffer (a fifth faster than an
    update per piece; the same bytes)."""
    p, o, v, t = prev.encode(), str(originator_id).encode(), str(version).encode(), topic.encode()
    return hashlib.sha256(
        b"".join(
            (
                _TAG_PART,
                len(p).to_bytes(8, "big"),
                p,
                len(o).to_bytes(8, "big"),
                o,
                len(v).to_bytes(8, "big"),
                v,
                len(t).to_bytes(8, "big"),
                t,
                len(state).to_bytes(8, "big"),
                state,
            )
        )
    ).hexdigest()


class HeadsDigest:
    """One short digest over every stream head (id, last version, its hash), fed in
    stream-id order (the events table's key order, the same on every store)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256(_TAG + b"/heads")
        self.streams = 0

    def add(self, originator_id: UUID, version: int, hx: str) -> None:
        self._h.update(f"{originator_id}:{version}:{hx}\n".encode())
        self.streams += 1

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:32]


def oid_param(dialect: str, oid: UUID) -> Any:
    """An originator id as the store's events table keeps it."""
    return oid if dialect == "postgres" else oid.hex


def as_uuid(value: Any) -> UUID:
    """An originator id read back from either store."""
    return value if isinstance(value, UUID) else UUID(str(value))


def ddl(dialect: str) -> list[str]:
    """The hash table of schema versions 2-10 (created by version 2, folded into the events
    table by version 11: `migration`)."""
    oid = "UUID" if dialect == "postgres" else "TEXT"
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    return [
        (
            f"CREATE TABLE IF NOT EXISTS {LEGACY_HASH_TABLE} (originator_id {oid} NOT NULL, "
            f"originator_version {big} NOT NULL, hash TEXT NOT NULL, "
            "PRIMARY KEY (originator_id, originator_version))"
        ),
    ]


def fetch_hashes(tx: Tx, keys: Sequence[tuple[UUID, int]]) -> dict[tuple[UUID, int], str]:
    """Stored hashes of the given (stream, version) pairs that have one."""
    dialect = tx.store.dialect
    sql = STATEMENTS.sql(tx, "fetch_hashes")
    out: dict[tuple[UUID, int], str] = {}
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        wanted = set(chunk)
        # by stream id and a version range (the primary key, so an index search on both
        # stores; a row-value IN list is planned as a full scan on SQLite), then pick the
        # versions asked for; the streams as one list parameter (PostgreSQL: an array, so
        # the statement text is the same for any number of streams and stays prepared)
        streams = [oid_param(dialect, oid) for oid in dict.fromkeys(oid for oid, _v in chunk)]
        versions = [v for _o, v in chunk]
        rows = tx.fetch_rows(sql, (tx_list(tx, streams), min(versions), max(versions)))
        for oid, version, hx in rows:
            key = (as_uuid(oid), int(version))
            if key in wanted:
                out[key] = hx
    return out


def heads_statement(tx: Tx, streams: Sequence[UUID]) -> tuple[str, tuple[Any, ...]]:
    """The statement (and its parameters) reading the last event of each stream, for
    a command to send in the round trip of its own read of those streams' rows, after
    the statement that locks them (the statement of `raw.stream_heads`); `note_heads`
    keeps its answer on the transaction."""
    dialect = tx.store.dialect
    ids = [oid_param(dialect, oid) for oid in dict.fromkeys(streams)]
    name = "stream_heads_pg" if dialect == "postgres" else "stream_heads"
    return STATEMENTS.sql(tx, name), (tx_list(tx, ids),)


def note_heads(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """Keep the stream heads read by `heads_statement` on the transaction: the chain of
    the events then appended to those streams starts from them (`chain_hashes`) instead
    of reading them again. An event stored before the hash chain chains to GENESIS."""
    known = tx.known_hashes
    for oid, version, hx in rows:
        known[(as_uuid(oid), int(version))] = hx or GENESIS


def chain_hashes(tx: Tx, stored: Sequence[StoredEvent]) -> list[str]:
    """The chained hash of each event about to be inserted, in order (Tx.append stores
    each on its event's row): the previous version's hash is the batch's own or the
    stored one (read by the command with its rows, `note_heads`, or read here)."""
    if not stored:
        return []
    batch: dict[tuple[UUID, int], str] = {}
    keys = {(as_uuid(se.originator_id), se.originator_version) for se in stored}
    wanted = [
        (oid, version - 1)
        for oid, version in keys
        if version > 1 and (oid, version - 1) not in keys
    ]
    # the heads the command read with its rows (`note_heads`), the others read now
    known = tx.known_hashes
    previous = {key: known[key] for key in wanted if key in known}
    missing = [key for key in wanted if key not in previous]
    if missing:
        previous.update(fetch_hashes(tx, missing))
    out = []
    for se in stored:
        oid, version = as_uuid(se.originator_id), se.originator_version
        prev = batch.get((oid, version - 1)) or previous.get((oid, version - 1)) or GENESIS
        hx = event_hash(prev, oid, version, se.topic, se.state)
        batch[(oid, version)] = hx
        out.append(hx)
    return out
