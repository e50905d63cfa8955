"""A follower's checkpoint row in `lg_followers` (name -> position, its filter, its last
owner): the statements `Follower`, `followers` and `reset` (ledger/feed/follower.py) and the
webhooks read and move it with.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ledger.core.errors import FollowerBusy, FollowerNotFound
from ledger.core.rows import iso
from ledger.feed.sql import SQL
from ledger.reads import feed

if TYPE_CHECKING:
    from ledger.stores.base import Tx


def owner() -> str:
    """Who holds a checkpoint now: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def ensure(tx: Tx, name: str, flt: feed.FeedFilter, position: int = 0) -> None:
    """The checkpoint row of `name`, created at `position` if missing."""
    now = iso(tx.now())
    tx.execute(
        SQL.sql(tx, "create_checkpoint"),
        (name, position, flt.run_id, flt.kinds_json(), now, now, owner()),
    )


def checkpoint(tx: Tx, name: str) -> int | None:
    """The position of follower `name`, None when there is no such follower."""
    row = tx.fetchone(SQL.sql(tx, "checkpoint"), (name,))
    return None if row is None else int(row["position"])


def position(tx: Tx, name: str) -> int:
    found = checkpoint(tx, name)
    if found is None:
        raise FollowerNotFound(name)
    return found


def checkpoint_sql(tx: Tx, lock: bool = True) -> str:
    """The checkpoint's statement (parameter: the name) with the database clock and the
    readable bound, its row locked (PostgreSQL) with `lock`."""
    return SQL.sql(tx, "checkpoint_with_bound_locked" if lock else "checkpoint_with_bound")


def locked_position(tx: Tx, name: str) -> tuple[int, int | None]:
    """The checkpoint, its row locked until the transaction ends (PostgreSQL: nothing else
    moves it meanwhile, so `set_position` needs no answer), and the feed's readable
    bound (`Tx.readable_position`, None where there is none), with the database clock for
    `tx.now()`: one round trip."""
    return checkpoint_row(tx, tx.fetchall(checkpoint_sql(tx), (name,)), name)


def checkpoint_row(tx: Tx, rows: list[dict[str, Any]], name: str) -> tuple[int, int | None]:
    """`locked_position` from the rows of `checkpoint_sql`."""
    if not rows:
        raise FollowerNotFound(name)
    row = rows[0]
    if "db_now" in row:
        tx.prime_now(row["db_now"])
    readable = row.get("readable")
    return int(row["position"]), None if readable is None else int(readable)


def set_position(
    tx: Tx, name: str, before: int, after: int, flt: feed.FeedFilter, at: datetime | None = None
) -> None:
    """Move the checkpoint from `before` to `after` (matching nothing if it is not at
    `before`: the caller read it locked in this transaction, or reads it after): a
    statement whose answer is not waited for (pipelined on PostgreSQL). `at`, its
    `updated_at`, defaults to the transaction's clock (external mode passes the time its
    batch was read: the write goes with the next batch's read, or alone, in one round
    trip that has no clock reading before it)."""
    tx.execute(
        SQL.sql(tx, "move_checkpoint"),
        (after, iso(at or tx.now()), owner(), flt.run_id, flt.kinds_json(), name, before),
    )


def relax_commit(tx: Tx) -> None:
    """External mode's checkpoint writes do not wait for the disk (PostgreSQL
    `synchronous_commit = off` for the transaction): at least once allows it, a write
    lost in a server crash (its last fraction of a second) delivers its batch again.
    In-database mode keeps the durable commit: the handler's rows are in it."""
    if tx.store.dialect == "postgres":
        tx.execute(SQL.sql(tx, "relax_commit"))


def moved(name: str) -> str:
    return (
        f"the checkpoint of follower {name!r} moved while a batch was handled "
        "(reset, or another holder): the batch was not recorded"
    )


def advance(tx: Tx, name: str, before: int, after: int, flt: feed.FeedFilter) -> None:
    """Move the checkpoint from `before` to `after`, refusing (and so rolling back the
    batch) when someone else moved it meanwhile (a reset, or a holder of a lost lock)."""
    done = tx.fetchall(
        SQL.sql(tx, "advance_checkpoint"),
        (after, iso(tx.now()), owner(), flt.run_id, flt.kinds_json(), name, before),
    )
    if not done:
        raise FollowerBusy(moved(name))
