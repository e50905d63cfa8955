"""Keyset-paged reads of a run's items, attempts and history.

Each read has one order and one cursor, both served by an index:

- items: manifest order (`seq`); the cursor is the last item id seen
  (index lg_items_seq, or lg_items_state with a state filter);
- attempts: `started_at`, then manifest order, then attempt number; the cursor is the
  last attempt's key `"<item_id>:<attempt>"` (or the tuple `(item_id, attempt)`)
  (index lg_attempts_started; one item's attempts use the primary key); the open
  attempts are the leases of the items in progress (lg_items_leased);
- history: position order; the cursor is the last transition's `position`
  (the event log's run index: a transition is a row of the log, ledger/core/recorded.py).

`page(...)` functions read one page in one read transaction; `iter_*` functions read
page after page (one read transaction each) so neither the database nor the client
holds more than a page at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ledger.core import args as A
from ledger.core.errors import InvalidInput
from ledger.core.rows import parse_dt
from ledger.core.states import ITEM_STATES
from ledger.core.views import Attempt, ItemStatus, Transition
from ledger.reads.queries import _dt, item_row, item_status, load_run, transition
from ledger.reads.sql import SQL
from ledger.stores.base import Store, Tx

MAX_PAGE = 10_000  # the largest page one call reads (HTTP's maximum too)
PAGE = 1_000  # the page size of a read that returns everything


def check_limit(limit: Any) -> int | None:
    """None or an integer page size from 1 to MAX_PAGE; InvalidInput otherwise."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
    return limit


def _check_state(state: Any) -> str | None:
    if state is not None and state not in ITEM_STATES:
        raise InvalidInput(
            f"state {state!r} is not an item state; states: {', '.join(ITEM_STATES)}"
        )
    return state if state is None else str(state)


# --------------------------------------------------------------------------
# items
# --------------------------------------------------------------------------
def _item_seq(tx: Tx, run_id: str, item_id: str) -> int:
    row = tx.fetchone(SQL.sql(tx, "item_seq"), (run_id, item_id))
    if row is None:
        raise InvalidInput(f"after: run {run_id} has no item {item_id!r}")
    return int(row["seq"])


def _items_page(tx: Tx, run_id: str, state: str | None, seq: int, n: int) -> list[dict[str, Any]]:
    if state is None:
        return tx.fetchall(SQL.sql(tx, "items_page"), (run_id, seq, n))
    return tx.fetchall(SQL.sql(tx, "items_page_in_state"), (run_id, state, seq, n))


def iter_items(
    store: Store,
    run_id: str,
    state: str | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> Iterator[list[ItemStatus]]:
    """The run's items in manifest order, page by page: one page of `limit` after the
    item id `after`, or (without `limit`) every page. Arguments are checked at once."""
    run_id = A.run_id(run_id)
    state = _check_state(state)
    limit = check_limit(limit)
    cursor = None if after is None else A.item_id(after)
    with store.read() as tx:
        load_run(tx, run_id, lock=False)
        seq = -1 if cursor is None else _item_seq(tx, run_id, cursor)
    return _pages(
        lambda s, n: _read(store, lambda tx: _items_page(tx, run_id, state, s, n)),
        lambda rows: rows[-1]["seq"],
        item_status,
        seq,
        limit,
    )


# --------------------------------------------------------------------------
# attempts
# --------------------------------------------------------------------------
def attempt_cursor(value: Any) -> tuple[str, int]:
    """An attempt cursor `"<item_id>:<attempt>"` or `(item_id, attempt)` as a tuple."""
    if isinstance(value, str):
        item, sep, number = value.rpartition(":")
        if not sep or not number.isascii() or not number.isdigit() or len(number) > 9:
            raise InvalidInput(f"after must be '<item_id>:<attempt>', got {value!r}")
        value = (item, int(number))
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or isinstance(value[1], bool)
        or not isinstance(value[1], int)
        or not 1 <= value[1] < 2**31
    ):
        raise InvalidInput("after must be '<item_id>:<attempt>' or (item_id, attempt)")
    return A.item_id(value[0]), value[1]


def _attempt(r: dict[str, Any]) -> Attempt:
    return Attempt(
        r["run_id"],
        r["item_id"],
        r["attempt"],
        r["worker_id"],
        r["lease_token"],
        _dt(r["started_at"]),
        _dt(r["expires_at"]),
        parse_dt(r["finished_at"]),
        r["stage"],
        r["outcome"],
        r["error"],
    )


# the SQLite text of the run's attempt page (tests read its plan)
_RUN_ATTEMPTS = SQL.sql("sqlite", "run_attempts_page")

AttemptKey = tuple[str, int, int]  # started_at, item seq, attempt


def iter_attempts(
    store: Store,
    run_id: str,
    item_id: str | None = None,
    limit: int | None = None,
    after: Any = None,
) -> Iterator[list[Attempt]]:
    """Attempts of the run (or of one item), oldest first, page by page after the
    attempt key `after`. Arguments are checked at once."""
    run_id = A.run_id(run_id)
    item = None if item_id is None else A.item_id(item_id)
    limit = check_limit(limit)
    cursor = None if after is None else attempt_cursor(after)
    with store.read() as tx:
        load_run(tx, run_id, lock=False)
        if item is not None:
            item_row(tx, run_id, item)
            if cursor is not None and cursor[0] != item:
                raise InvalidInput(f"after {after!r} is not an attempt of item {item!r}")
        start: Any = None
        if cursor is not None:
            row = tx.fetchone(SQL.sql(tx, "attempt_key"), (run_id, *cursor, run_id, *cursor))
            if row is None:
                raise InvalidInput(f"after: run {run_id} has no attempt {after!r}")
            start = (row["started_at"], int(row["seq"]), cursor[1])
    if item is not None:
        one = item

        def item_page(key: Any, n: int) -> list[dict[str, Any]]:
            number = 0 if key is None else key[2]
            return _read(
                store,
                lambda tx: tx.fetchall(
                    SQL.sql(tx, "item_attempts_page"), (run_id, one, number) * 2 + (n,)
                ),
            )

        return _pages(item_page, lambda rows: ("", 0, rows[-1]["attempt"]), _attempt, start, limit)

    def run_page(key: Any, n: int) -> list[dict[str, Any]]:
        at, seq, number = ("", -1, 0) if key is None else key

        def read(tx: Tx) -> list[dict[str, Any]]:
            # the page ends at or before the n-th start time after the cursor's: found
            # on the index alone, it bounds the join and sort to about one page (else
            # PostgreSQL hashes the whole run's items for every page)
            end = tx.fetchone(
                SQL.sql(tx, "run_attempts_page_end"), (run_id, at, n, run_id, at, n, n - 1)
            )
            if end is None:
                key: tuple[Any, ...] = (run_id, at, at, seq, seq, number)
                return tx.fetchall(SQL.sql(tx, "run_attempts_page"), (*key, n, *key, n, n))
            key = (run_id, at, end["started_at"], at, seq, seq, number)
            return tx.fetchall(SQL.sql(tx, "run_attempts_page_upto"), (*key, n, *key, n, n))

        return _read(store, read)

    def last(rows: list[dict[str, Any]]) -> Any:
        r = rows[-1]
        return (r["started_at"], int(r["item_seq"]), r["attempt"])

    return _pages(run_page, last, _attempt, start, limit)


# --------------------------------------------------------------------------
# history
# --------------------------------------------------------------------------
def check_position(after: Any) -> int | None:
    """None or a position (0 to 2**63 - 1); InvalidInput otherwise."""
    if after is not None and (
        isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63
    ):
        raise InvalidInput("after must be a non-negative position")
    return after


def iter_history(
    store: Store, run_id: str, limit: int | None = None, after: int | None = None
) -> Iterator[list[Transition]]:
    """The run's transitions in position order, page by page after position `after`."""
    run_id = A.run_id(run_id)
    limit = check_limit(limit)
    position = check_position(after)
    with store.read() as tx:
        load_run(tx, run_id, lock=False)
    paged_by_client = limit is not None

    def page(pos: int | None, n: int) -> list[dict[str, Any]]:
        def read(tx: Tx) -> list[dict[str, Any]]:
            params: list[Any] = [run_id]
            name = "history_page"
            if pos is not None:
                name += "_after"
                params.append(pos)
            # a client paging by position must not pass one a slower writer may still
            # fill in (rule 18), as audit does
            bound = tx.readable_position() if paged_by_client else None
            if bound is not None:
                name += "_upto"
                params.append(bound)
            return tx.fetchall(SQL.sql(tx, name), (*params, n))

        return _read(store, read)

    return _pages(page, lambda rows: rows[-1]["position"], transition, position, limit)


# --------------------------------------------------------------------------
# the paging loop
# --------------------------------------------------------------------------
def _read(store: Store, fn: Any) -> list[dict[str, Any]]:
    with store.read() as tx:
        return fn(tx)  # type: ignore[no-any-return]


def _pages(read: Any, last: Any, convert: Any, cursor: Any, limit: int | None) -> Iterator[Any]:
    """Yield converted pages: one of `limit` rows, or every page of PAGE rows."""
    n = PAGE if limit is None else limit
    while True:
        rows = read(cursor, n)
        if rows or limit is not None:
            yield [convert(r) for r in rows]
        if limit is not None or len(rows) < n:
            return
        cursor = last(rows)


def collect(pages: Iterator[list[Any]]) -> list[Any]:
    """Every page's values as one list."""
    out: list[Any] = []
    for page in pages:
        out.extend(page)
    return out
