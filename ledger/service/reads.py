"""The reads of `Ledger` (ledger/service/ledger.py): `LedgerReads`, a mixin the facade inherits,
so every read stays a `Ledger` method while the commands' module stays short. Each read
is retried on `StoreUnavailable` (`read_command`) and delegates to `ledger/reads/queries.py`
or its own module (board, overview, feed, time travel).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, cast

from ledger.commands.idempotency import read_command, typed_refusals
from ledger.core import args as A
from ledger.core.errors import InvalidInput, RunNotFound
from ledger.core.validation import utc_time
from ledger.core.views import Attempt, ItemStatus, RunStatus, Transition
from ledger.reads import queries
from ledger.stores.base import Store, Tx

if TYPE_CHECKING:
    from ledger.reads.board import BoardPage
    from ledger.reads.overview import Overview
    from ledger.service.ledger import Ledger


class LedgerReads:
    """`Ledger`'s reads: runs, items, attempts, history, lineage, audit, the board and
    overview, the change feed and the status at a past time."""

    store: Store

    def _status_tx(self, tx: Tx, run_id: str) -> RunStatus:
        return queries.status_tx(tx, run_id)

    @read_command
    def status(self, run_id: str) -> RunStatus:
        """The run as accepted by the store."""
        return queries.status(self.store, run_id)

    @read_command
    def runs(self, state: str | None = None, limit: int = 100) -> list[RunStatus]:
        """Runs, newest first."""
        return queries.runs(self.store, state, limit)

    @read_command
    def items(
        self,
        run_id: str,
        state: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[ItemStatus]:
        """The run's items in manifest order. With `limit` (1 to 10,000): one keyset page
        after the item id `after`; without it every item (read page by page)."""
        return queries.items(self.store, run_id, state, limit, after)

    @read_command
    def item(self, run_id: str, item_id: str) -> ItemStatus:
        """One item."""
        return queries.item(self.store, run_id, item_id)

    @read_command
    def attempts(
        self,
        run_id: str,
        item_id: str | None = None,
        limit: int | None = None,
        after: str | tuple[str, int] | None = None,
    ) -> list[Attempt]:
        """Every attempt of the run (or of one item), oldest first. With `limit`: one
        keyset page after the attempt key `after` (`"<item_id>:<attempt>"`)."""
        return queries.attempts(self.store, run_id, item_id, limit, after)

    @read_command
    def history(
        self, run_id: str, limit: int | None = None, after: int | None = None
    ) -> list[Transition]:
        """Every run and item transition of the run, in position order, starting with its
        submit. With `limit`: one keyset page after the position `after`."""
        return queries.history(self.store, run_id, limit, after)

    @read_command
    def lineage(self, run_id: str) -> list[RunStatus]:
        """The runs linked to this one (same root), root first."""
        return queries.lineage(self.store, run_id)

    @read_command
    def resolve_run_id(self, text: str) -> str:
        """The run id that `text` names: a whole run id, or a unique prefix of one (at least
        4 characters, as the short ids the `ledger` command's tables show). No match is
        `RunNotFound`; several are `InvalidInput`, listing them."""
        if not isinstance(text, str):
            raise InvalidInput("a run id must be a string")
        prefix = text.strip().lower()
        if len(prefix) == 36:
            return str(A.run_id(prefix))
        if len(prefix) < 4:
            raise InvalidInput(f"{text!r} is too short: give 4 or more characters of a run id")
        if len(prefix) > 36 or not set(prefix) <= set("0123456789abcdef-"):
            raise RunNotFound(text)  # no run id has such characters
        found = queries.run_ids_with_prefix(self.store, prefix)
        if not found:
            raise RunNotFound(text, f"no run id starts with {prefix!r}")
        if len(found) > 1:
            shown = ", ".join(found[: queries.PREFIX_MATCHES_SHOWN])
            more = " and more" if len(found) > queries.PREFIX_MATCHES_SHOWN else ""
            raise InvalidInput(
                f"run id prefix {prefix!r} is ambiguous: it starts {shown}{more}; give more of it"
            )
        return found[0]

    @read_command
    def audit(
        self,
        run_id: str | None = None,
        actor: str | None = None,
        role: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        newest_first: bool = False,
        after: int | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> list[Transition]:
        """Transitions filtered by run, actor id, role, target state and time, in position
        order (newest first with `newest_first`); keyset-paged by position with `after` and
        `limit`. Webhook changes are among them (a transition of no run: empty `run_id`,
        command `webhook_add`, `webhook_change`, ...; the webhook in `evidence`), unless a
        run or a target state is asked for. A list, as every read returns; `iter_audit`
        streams a long one."""
        return list(
            self.iter_audit(
                run_id, actor, role, state, since, until, newest_first, after, limit, page_size
            )
        )

    @typed_refusals
    def iter_audit(
        self,
        run_id: str | None = None,
        actor: str | None = None,
        role: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        newest_first: bool = False,
        after: int | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> Iterator[Transition]:
        """`audit` as an iterator that reads `page_size` transitions per read transaction:
        memory stays bounded however long the audit log is. The arguments are checked
        before the first transition is read."""
        return _typed_iter(
            queries.audit(
                self.store,
                run_id,
                actor,
                role,
                state,
                since,
                until,
                newest_first,
                after,
                limit,
                page_size,
            )
        )

    @read_command
    def board(
        self,
        state: str | None = None,
        waiting_on: str | None = None,
        stalled: bool = False,
        terminal: bool = False,
        after: int | None = None,
        limit: int = 50,
        order: str = "newest",
    ) -> BoardPage:
        """A page of runs with who they wait on since when, newest first (or by attention,
        `order="attention"`, as `ledger top` ranks them): open runs, or terminal ones with
        `terminal` (ledger/reads/board.py)."""
        from ledger.reads.board import board

        return board(self.store, state, waiting_on, stalled, terminal, after, limit, order)

    @read_command
    def overview(self) -> Overview:
        """Open runs by state and waiting_on, the oldest wait per owner, stalled runs and
        expired leases, across every run (ledger/reads/overview.py)."""
        from ledger.reads.overview import overview

        return overview(self.store)

    @read_command
    def events(
        self,
        after: int | None = None,
        run_id: str | None = None,
        kinds: Sequence[str] | str | None = None,
        limit: int = 1000,
        payloads: bool = False,
    ) -> list[Transition]:
        """The change feed: transitions after position `after` in position order (one page of
        at most `limit`), of one run or all, whose command or new state is one of `kinds`.
        With `payloads`, each item transition carries its item's payload as it stood at that
        transition (`Transition.payload`, from the run's manifest and amendments)."""
        from ledger.reads.feed import events

        return events(self.store, after, run_id, kinds, limit, payloads)

    @typed_refusals
    def wait_for_events(self, after: int | None, timeout: float) -> bool:
        """Block until a transition past `after` has committed (True) or `timeout` seconds
        pass (False). LISTEN/NOTIFY on PostgreSQL, short polling elsewhere (ledger/reads/feed.py)."""
        from ledger.reads.feed import wait_for_events

        return wait_for_events(self.store, after, timeout)

    @read_command
    def status_at(self, run_id: str, at: datetime) -> RunStatus:
        """The run's status as the store had accepted it at time `at`, replayed from its events."""
        from ledger.core import args as A
        from ledger.reads.timetravel import status_at

        run_id = A.run_id(run_id)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise InvalidInput("at must be an aware datetime")
        return status_at(cast("Ledger", self), run_id, utc_time(at, "at"))


@typed_refusals
def _next(it: Iterator[Transition]) -> Transition:
    return next(it)


def _typed_iter(it: Iterator[Transition]) -> Iterator[Transition]:
    """`it`, whose refusals, also those met while iterating, are typed."""
    while True:
        try:
            yield _next(it)
        except StopIteration:
            return
