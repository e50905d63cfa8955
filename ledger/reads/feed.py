"""The change feed: every transition in position order, and a wake-up when new ones commit.

`Ledger.events(...)` and `Ledger.wait_for_events(...)` are thin wrappers over this
module; `ledger/feed/follower.py` builds durable followers on it.

Reading by position is safe because a position never appears behind one already
read (rule 18 of the rule book): every page is bounded by a readable position read first, in a
statement of its own, and everything at or below it has committed or never will (the
feed's *head* is the last transition there). `head()` and `page()` are the one
place that reads `lg_transitions` (the view of the event log's transition columns) for the feed, so a change of the write path's
ordering scheme changes them and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.errors import InvalidInput, RunNotFound
from ledger.core.validation import check_identifier
from ledger.core.views import Transition
from ledger.reads.payloads import attach as attach_payloads
from ledger.reads.sql import SQL
from ledger.stores.named import tx_list

if TYPE_CHECKING:
    from ledger.stores.base import Store, Tx

MAX_POSITION = 2**63 - 1  # positions are BIGINT
MAX_LIMIT = 10_000
SQLITE_POLL_S = 0.05  # SQLite has no notifications: look this often (an indexed probe)
PG_RECHECK_S = 1.0  # even with no notification, look again this often (a lost one only delays)


def commands() -> frozenset[str]:
    """Every command a transition can record (the rule book's rows)."""
    names = {r.command for r in (*S.RUN_TRANSITIONS, *S.ITEM_TRANSITIONS)}
    names.update(getattr(S, "RUN_COMMAND_ROLES", {}))
    return frozenset(names)


def check_position(value: Any, what: str = "after") -> int:
    """A position: a non-negative integer a BIGINT holds (None means 0, the start)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be a position (a non-negative integer), not {value!r}")
    if value < 0 or value > MAX_POSITION:
        raise InvalidInput(f"{what} must be a position between 0 and {MAX_POSITION}, not {value}")
    return value


def check_limit(value: Any, maximum: int = MAX_LIMIT, what: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidInput(f"{what} must be an integer from 1 to {maximum}, not {value!r}")
    return value


@dataclass(frozen=True)
class FeedFilter:
    """Which transitions a reader wants: one run's or all, and by command or target state
    (a transition matches when its command or its new state is one of `kinds`)."""

    run_id: str | None = None
    kinds: tuple[str, ...] = ()

    @classmethod
    def of(cls, run_id: Any = None, kinds: Any = None) -> FeedFilter:
        """Validated: a run id and kinds that are commands or run or item states."""
        if run_id is not None:
            run_id = check_identifier(run_id, "run_id")
        return cls(run_id, check_kinds(kinds))

    def variant(self, tx: Tx) -> tuple[str, list[Any]]:
        """Which named statement of a feed read applies: the suffix of its name (empty
        when nothing is filtered, `_of_run`, `_of_kinds` or `_of_run_kinds`), and the
        filter's parameters, after the position's (the kinds one list, given twice)."""
        suffix = ""
        params: list[Any] = []
        if self.run_id is not None:
            suffix += "_of_run"
            params.append(self.run_id)
        if self.kinds:
            suffix += "_of_kinds" if self.run_id is None else "_kinds"
            kinds = tx_list(tx, self.kinds)
            params += [kinds, kinds]
        return suffix, params

    def kinds_json(self) -> str | None:
        return json.dumps(list(self.kinds)) if self.kinds else None

    def matches(self, t: Transition) -> bool:
        if self.run_id is not None and t.run_id != self.run_id:
            return False
        return not self.kinds or t.command in self.kinds or t.to_state in self.kinds


def check_kinds(kinds: Any) -> tuple[str, ...]:
    """`kinds`: None, one name, or names; each a command or a run or item state."""
    if kinds is None:
        return ()
    if isinstance(kinds, str):
        kinds = [kinds]
    if not isinstance(kinds, Iterable) or isinstance(kinds, (bytes, dict)):
        raise InvalidInput("kinds must be a list of commands or states")
    known = commands() | set(S.RUN_STATES) | set(S.ITEM_STATES)
    out: list[str] = []
    for kind in kinds:
        if not isinstance(kind, str) or kind not in known:
            raise InvalidInput(
                f"kind {kind!r} is neither a command nor a state; commands: "
                f"{', '.join(sorted(commands()))}; states: "
                f"{', '.join(sorted(set(S.RUN_STATES) | set(S.ITEM_STATES)))}"
            )
        if kind not in out:
            out.append(kind)
    return tuple(sorted(out))


def head(tx: Tx) -> int:
    """The highest position a reader may read up to now: every transition at or below it
    has committed or never will (on PostgreSQL a slower writer may still fill in a lower
    position than one committed: `Tx.readable_position`, stores/pg_positions.py)."""
    return _head_below(tx, tx.readable_position())  # a statement of its own, before the MAX's


def _head_below(tx: Tx, bound: int | None) -> int:
    """The highest transition position at or below `bound` (None: of all)."""
    if bound is None:
        row = tx.fetchone(SQL.sql(tx, "feed_head"))
    else:
        row = tx.fetchone(SQL.sql(tx, "feed_head_upto"), (bound,))
    return int(row["head"]) if row else 0


# the columns in the order the feed's SELECT reads them (queries.sql, feed_page*): the
# Transition fields but reason and evidence, which are decoded from the event's topic and
# state on first read (views._Recorded), as `at` from its text (views._Decoded)
_FIELDS = (
    "run_id",
    "item_id",
    "from_state",
    "to_state",
    "actor_id",
    "role",
    "topic",
    "state",
    "at",
    "revision",
    "position",
    "command",
)
_POSITION = _FIELDS.index("position")


def unfiltered_page_sql(tx: Tx) -> str:
    """The unfiltered page's statement (parameters: after, limit): the plain keyset read."""
    return SQL.sql(tx, "feed_page")


def page(
    tx: Tx, after: int, flt: FeedFilter, limit: int, upto: int | None = None
) -> tuple[list[Transition], int]:
    """Up to `limit` transitions after `after` that match `flt`, in position order, and the
    cursor to resume after: the last one's position on a full page, else the head the page
    was bounded by (the reader has seen everything up to it, matching or not). `upto`: a
    readable bound read before in the same transaction (`Tx.readable_position`), instead
    of asking for one here.

    The SELECT itself has no upper bound: it is the plain keyset read (`position > ?
    ORDER BY position, ord LIMIT ?`), whose plan walks the position index whatever the
    table's statistics say (with `position <= head` in it, statistics older than a bulk
    load made PostgreSQL read the whole range and sort it: 50 ms a page instead of 2). The
    rows past the bound, committed after it was read, are dropped here. Without a filter
    the head needs no statement of its own: the page then holds every transition up to
    it, so a short page's cursor is its last position."""
    bound = tx.readable_position() if upto is None else upto
    suffix, params = flt.variant(tx)
    if not suffix:
        if bound is not None and bound <= after:
            return [], after
        return unfiltered_page(tx.fetch_rows(unfiltered_page_sql(tx), (after, limit)), after, bound)
    top = _head_below(tx, bound)  # transitions that do not match may lie past the last match
    if top <= after:
        return [], after
    rows = tx.fetch_rows(SQL.sql(tx, "feed_page" + suffix), (after, *params, limit))
    found = transitions(_upto(rows, top))
    return found, found[-1].position if len(found) == limit else top


def unfiltered_page(
    rows: Sequence[Sequence[Any]], after: int, bound: int | None
) -> tuple[list[Transition], int]:
    """`page` without a filter from the rows of `unfiltered_page_sql` (parameters: after,
    limit), sent after the readable `bound` was read (a caller may send both at once,
    `Tx.fetch_both`): every transition up to the bound is on the page unless it is full,
    so the cursor is the last one's position either way (or `after` when none)."""
    found = transitions(_upto(rows, bound))
    return found, found[-1].position if found else after


def _upto(rows: Sequence[Sequence[Any]], bound: int | None) -> Sequence[Sequence[Any]]:
    """The rows at or below the readable bound (the ones past it committed after it)."""
    if bound is not None and rows and rows[-1][_POSITION] > bound:
        return [r for r in rows if r[_POSITION] <= bound]
    return rows


def transitions(rows: Sequence[Sequence[Any]]) -> list[Transition]:
    """lg_transitions rows (in `_FIELDS` order) as Transition values, equal to
    `queries.transition`'s. Each frozen value's fields are stored straight into its
    `__dict__` from its row (no dict per row from the driver, no `__init__`: written out,
    three times faster than `update(zip(...))`), and its reason and evidence (from the
    event's state) and its `at` time are decoded when first read (`views._Recorded`,
    `views._Decoded`): a handler that never looks at them does not pay for them."""
    new = object.__new__
    out: list[Transition] = []
    append = out.append
    for (
        run_id,
        item_id,
        from_state,
        to_state,
        actor_id,
        role,
        topic,
        state,
        at,
        revision,
        position,
        command,
    ) in rows:
        t = new(Transition)
        d = t.__dict__
        d["run_id"] = run_id
        d["item_id"] = item_id
        d["from_state"] = from_state
        d["to_state"] = to_state
        d["actor_id"] = actor_id
        d["role"] = role
        d["_raw_event"] = (topic, state)
        d["_raw_at"] = at
        d["revision"] = revision
        d["position"] = position
        d["command"] = command
        append(t)
    return out


def read(store: Store, after: int, flt: FeedFilter, limit: int) -> list[Transition]:
    """One page of the feed in its own read transaction."""
    with store.read() as tx:
        return page(tx, after, flt, limit)[0]


def has_after(store: Store, after: int) -> bool:
    with store.read() as tx:
        return head(tx) > after


class Waiter:
    """Waits for a transition past a position. On PostgreSQL it LISTENs on the channel the
    write path NOTIFYs (on a connection of its own, opened on first use) and looks again
    at least every PG_RECHECK_S, so a lost notification only delays the wake-up; on SQLite
    and memory it polls every SQLITE_POLL_S. Not shared between threads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._conn: Any = None

    def _listen(self) -> Any:
        if self._conn is None:
            import psycopg
            from psycopg import sql

            dsn = getattr(self.store, "dsn", None)
            conn = psycopg.connect(dsn, autocommit=True) if dsn else None
            if conn is not None:
                conn.execute(
                    sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(self.store)))
                )
            self._conn = conn
        return self._conn

    def wait(self, after: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """True as soon as a transition past `after` has committed; False after `timeout`
        seconds (or once `stop` is set) without one."""
        deadline = time.monotonic() + timeout
        conn = self._listen_or_poll() if self.store.dialect == "postgres" else None
        while True:
            # LISTEN came first: a commit after this look still wakes the wait below
            if has_after(self.store, after):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            if conn is not None:
                try:
                    for _ in conn.notifies(timeout=min(remaining, PG_RECHECK_S), stop_after=1):
                        pass
                except Exception:  # the listening connection died: poll until it is back
                    self.close()
                    conn = None
            elif stop is not None:
                stop.wait(min(remaining, SQLITE_POLL_S))
            else:
                time.sleep(min(remaining, SQLITE_POLL_S))

    def _listen_or_poll(self) -> Any:
        """The LISTEN connection; None (poll instead) while it cannot be opened: a
        wake-up is only a hint, the look at the store decides."""
        try:
            return self._listen()
        except Exception:
            self.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            try:
                with contextlib.suppress(Exception):  # closing a dead connection
                    self._conn.close()
            finally:
                self._conn = None


def notify_channel(store: Store) -> str:
    """The channel the PostgreSQL write path NOTIFYs after appending events."""
    recorder = getattr(store, "recorder", None)
    channel = getattr(recorder, "channel_name", None) or store.events_table()
    return str(channel)


def check_timeout(timeout: Any) -> float:
    """A wait's timeout: a number of seconds from 0 to 86400."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (0 <= timeout <= 86_400)
    ):
        raise InvalidInput(f"timeout must be a number of seconds from 0 to 86400, not {timeout!r}")
    return float(timeout)


def wait_for_events(store: Store, after: Any, timeout: Any) -> bool:
    """`Ledger.wait_for_events`: validated, with a waiter of its own."""
    after = check_position(after)
    seconds = check_timeout(timeout)
    waiter = Waiter(store)
    try:
        return waiter.wait(after, seconds)
    finally:
        waiter.close()


def events(
    store: Store,
    after: Any = None,
    run_id: Any = None,
    kinds: Any = None,
    limit: Any = 1000,
    payloads: Any = False,
) -> list[Transition]:
    """`Ledger.events`: validated, one page of the feed (with `payloads`, each item
    transition carries its item's payload as of that transition: `reads/payloads.py`)."""
    position = check_position(after)
    flt = FeedFilter.of(run_id, kinds)
    limit = check_limit(limit)
    with_payloads = check_flag(payloads, "payloads")
    with store.read() as tx:
        if flt.run_id is not None:
            check_run(tx, flt.run_id)
        found = page(tx, position, flt, limit)[0]
        if with_payloads:
            attach_payloads(tx, found)
        return found


def check_flag(value: Any, what: str) -> bool:
    """A yes/no argument: a bool."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be true or false, not {value!r}")
    return value


def check_run(tx: Tx, run_id: str) -> None:
    """RunNotFound unless the run exists (a feed of a mistyped run would stay empty)."""
    if tx.fetchone(SQL.sql(tx, "run_exists"), (run_id,)) is None:
        raise RunNotFound(run_id)
