"""The reads: runs, items, attempts, history, lineage and audit, and the mapping of
projection rows to the result values of `ledger.core.views`.

Every function takes an open transaction (`tx`) or the store; the `Ledger` facade
opens the read transaction and retries it on transient faults. The command handlers
use the same mappings for their answers, and `projections.timetravel` for a replayed
status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from ledger.core import args as A
from ledger.core import states as S
from ledger.core.domain import Item, Run
from ledger.core.errors import InvalidInput, ItemNotFound, RunNotFound, StoreUnavailable
from ledger.core.recorded import decode_recorded
from ledger.core.rows import iso, parse_dt, run_from_row
from ledger.core.validation import check_identifier, utc_time
from ledger.core.views import (
    MAX_STATUS_LINKS,
    Attempt,
    ItemStatus,
    Lease,
    Link,
    NotAcceptedItem,
    RunStatus,
    Transition,
)
from ledger.core.webhook_events import states_of
from ledger.projections.counts import attach as attach_counts
from ledger.reads.sql import SQL
from ledger.stores.base import Store, Tx

# --------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------
# Run states in which ending a lease may move the run ("the last live lease ends"): an item
# command on such a run holds its row FOR UPDATE, as run commands do.
DRAINING = frozenset({S.PAUSING, S.CANCELING})


class RunLockUpgrade(StoreUnavailable):
    """An item command holds a share lock on a run that a run command has meanwhile moved
    to a draining state: its transaction starts over (nothing was written)."""


def load_run(tx: Tx, run_id: str, lock: bool | str = True) -> Run:
    """The run's aggregate from its lg_runs row.

    `lock`: True or "update" (the run commands): the row locked FOR UPDATE on PostgreSQL
    for the transaction, and the run's counts exact. "item" (claim, heartbeat and the
    outcomes): FOR SHARE while the run is not draining, so workers do not wait for each
    other; the counts are then not read (another worker may move them; no decision of an
    item command reads them) and left as the row's column. On a draining run FOR UPDATE
    and exact counts. RunLockUpgrade when a share lock was granted on a draining run.
    False: no lock and no counts (existence and identity only)."""
    try:
        UUID(run_id)
    except ValueError:
        raise RunNotFound(run_id) from None
    row = tx.fetchone(tx.select_run_sql(lock), (run_id,))
    if row is None:
        raise RunNotFound(run_id)
    if "db_now" in row:
        tx.prime_now(row.pop("db_now"))
    held = row.pop("lock_mode", None)
    if lock == "item" and row["state"] in DRAINING and held == "share":
        raise RunLockUpgrade(
            f"run {run_id} became {row['state']} while this command waited for it; "
            "nothing was written"
        )
    if lock is True or lock == "update" or (lock == "item" and row["state"] in DRAINING):
        # a statement of its own, after the lock: it sees every writer that committed
        attach_counts(tx, [row])
    return run_from_row(row)


def item_row(tx: Tx, run_id: str, item_id: str, lock: bool = False) -> dict[str, Any]:
    """One item's row (locked for the transaction when `lock`, on PostgreSQL); ItemNotFound."""
    row = tx.fetchone(SQL.sql(tx, "item_locked" if lock else "item"), (run_id, item_id))
    if row is None:
        raise ItemNotFound(run_id, item_id)
    return row


PREFIX_MATCHES_SHOWN = 10


def run_ids_with_prefix(store: Store, prefix: str) -> list[str]:
    """The run ids that start with `prefix` (lower-case hex and dashes), at most
    `PREFIX_MATCHES_SHOWN + 1` of them, in order."""
    with store.read() as tx:
        rows = tx.fetchall(
            SQL.sql(tx, "run_ids_in_range"), (prefix, prefix + "~", PREFIX_MATCHES_SHOWN + 1)
        )
    return [r["run_id"] for r in rows]


def waiting_on(state: str, counts: dict[str, int]) -> str:
    """Who owns the next step (rule 9 of the rule book): the rule book's WAITING_ON table."""
    return S.waiting_on(state, counts)


def _dt(text: str) -> datetime:
    dt = parse_dt(text)
    assert dt is not None
    return dt


def status_tx(tx: Tx, run_id: str) -> RunStatus:
    """The run's status inside an open transaction, with who owns its delay by the
    transaction's clock (rule 19 of the rule book)."""
    row = tx.fetchone(SQL.sql(tx, "run"), (run_id,))
    if row is None:
        raise RunNotFound(run_id)
    attach_counts(tx, [row])
    return with_signals(tx, [row], [status_of_row(tx, row)])[0]


def status_of_row(tx: Tx, row: dict[str, Any]) -> RunStatus:
    """A run row as RunStatus, with its first 20 items not accepted."""
    na = tx.fetchall(SQL.sql(tx, "not_accepted_items"), (row["run_id"],))
    return status_from_row(row, na)


def with_signals(tx: Tx, rows: list[dict[str, Any]], statuses: list[RunStatus]) -> list[RunStatus]:
    """The statuses of `rows` with their delay signals (ledger/reads/signals.py), read in `tx`:
    `waiting_on` (reconciler when a lease expired unreconciled), the person, waiting since,
    last activity, stalled, rate, ETA and expired leases."""
    from ledger.reads.signals import signals_for

    found = signals_for(tx, rows, tx.now())
    return [replace(status, **found[status.run_id].status_fields()) for status in statuses]


def status_from_row(row: dict[str, Any], na: list[dict[str, Any]]) -> RunStatus:
    """A run row and its not-accepted item rows as RunStatus."""
    counts = json.loads(row["counts"])
    state = row["state"]
    links = json.loads(row["links"])
    return RunStatus(
        run_id=row["run_id"],
        state=state,
        revision=row["revision"],
        failure_kind=row["failure_kind"],
        failure_reason=row["failure_reason"],
        input_version=row["input_version"],
        counts=counts,
        summary=row["summary"] or f"run {state}",
        not_accepted=[
            NotAcceptedItem(r["item_id"], r["state"], bool(r["required"]), r["reason"]) for r in na
        ],
        waiting_on=waiting_on(state, counts),
        links=[Link(link["relation"], link["run_id"]) for link in links[:MAX_STATUS_LINKS]],
        links_total=len(links),
        cancel_requested=bool(row["cancel_requested"]),
        created_at=_dt(row["created_at"]),
        updated_at=_dt(row["updated_at"]),
        source_version=row["source_version"],
        config_version=row["config_version"],
        scope=row["scope"],
        created_by=row["created_by"],
        started_at=parse_dt(row["started_at"]),
        stopped_at=parse_dt(row["stopped_at"]),
        stop_reason=row["stop_reason"],
        review=None if row["review"] is None else json.loads(row["review"]),
        policy=json.loads(row["policy"]),
        root_run_id=row["root_run_id"],
    )


def item_status(r: dict[str, Any]) -> ItemStatus:
    """An item row as ItemStatus."""
    lease = None
    if r["state"] == S.IN_PROGRESS and r["lease_token"]:
        lease = Lease(
            r["run_id"],
            r["item_id"],
            r["lease_token"],
            r["lease_worker"],
            r["attempts"],
            _dt(r["lease_expires_at"]),
            None,
        )
    return ItemStatus(
        run_id=r["run_id"],
        item_id=r["item_id"],
        state=r["state"],
        required=bool(r["required"]),
        attempts=r["attempts"],
        lease=lease,
        last_error=r["last_error"],
        revision=r["revision"],
        reason=r["reason"],
        payload=json.loads(r["payload"]),
        updated_at=parse_dt(r["updated_at"]),
    )


def item_status_tx(tx: Tx, run_id: str, item_id: str) -> ItemStatus:
    """One item's status inside an open transaction."""
    return item_status(item_row(tx, run_id, item_id))


def merged_row(row: dict[str, Any], item: Item) -> dict[str, Any]:
    """An item row updated with its aggregate's current stream state (no re-read)."""
    return {
        **row,
        "state": item.state,
        "revision": item.version,
        "attempts": item.attempts,
        "lease_token": item.lease_token,
        "lease_worker": item.lease_worker,
        "lease_expires_at": item.lease_expires_at,
        "eligible_at": item.eligible_at,
        "last_error": item.last_error,
        "reason": item.reason,
        "updated_at": iso(item.modified_on),
    }


def transition(r: dict[str, Any]) -> Transition:
    """An lg_transitions row (the view of the event log's transition columns) as
    Transition, its reason and evidence read from the event's state."""
    reason, evidence = decode_recorded((r["topic"], r["state"]))
    return Transition(
        run_id=r["run_id"],
        item_id=r["item_id"],
        from_state=r["from_state"],
        to_state=r["to_state"],
        actor_id=r["actor_id"],
        role=r["role"],
        reason=reason,
        evidence=evidence,
        at=_dt(r["at"]),
        revision=r["revision"],
        position=r["position"],
        command=r["command"],
    )


def webhook_transition(r: dict[str, Any]) -> Transition:
    """An lg_webhook_changes row as audit shows it: a transition of no run (`run_id` is
    empty), command `webhook_<command>`, the webhook as it was after it in `evidence`."""
    before, after = states_of(r["command"])
    return Transition(
        run_id="",
        item_id=None,
        from_state=before,
        to_state=after,
        actor_id=r["actor_id"],
        role=r["role"],
        reason=r["reason"],
        evidence={
            "webhook_id": r["webhook_id"],
            "url": r["url"],
            "run_id": r["run_id"],
            "kinds": json.loads(r["kinds"]) if r["kinds"] else [],
            "allow_http": bool(r["allow_http"]),
            "allow_host": r["allow_host"],
            "secret_fingerprint": r["secret_fingerprint"],
        },
        at=_dt(r["at"]),
        revision=int(r["version"]),
        position=int(r["position"]),
        command="webhook_" + r["command"],
    )


# --------------------------------------------------------------------------
# the reads of the facade
# --------------------------------------------------------------------------
def status(store: Store, run_id: str) -> RunStatus:
    """The run as accepted by the store."""
    run_id = A.run_id(run_id)
    with store.read() as tx:
        try:
            UUID(run_id)
        except ValueError:
            raise RunNotFound(run_id) from None
        return status_tx(tx, run_id)


def runs(store: Store, state: str | None = None, limit: int = 100) -> list[RunStatus]:
    """Runs, newest first."""
    if state is not None and state not in S.RUN_STATES:
        raise InvalidInput(f"state {state!r} is not a run state; states: {', '.join(S.RUN_STATES)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidInput(f"limit must be an integer from 1 to 10000, got {limit!r}")
    with store.read() as tx:
        if state is None:
            rows = tx.fetchall(SQL.sql(tx, "runs_newest"), (limit,))
        else:
            rows = tx.fetchall(SQL.sql(tx, "runs_newest_in_state"), (state, limit))
        attach_counts(tx, rows)
        return with_signals(tx, rows, [status_of_row(tx, row) for row in rows])


def items(
    store: Store,
    run_id: str,
    state: str | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> list[ItemStatus]:
    """The run's items in manifest order (one page with `limit`; see ledger/reads/paging.py)."""
    from ledger.reads import paging

    return paging.collect(paging.iter_items(store, run_id, state, limit, after))


def item(store: Store, run_id: str, item_id: str) -> ItemStatus:
    """One item."""
    run_id = A.run_id(run_id)
    item_id = A.item_id(item_id)
    with store.read() as tx:
        load_run(tx, run_id, lock=False)
        return item_status_tx(tx, run_id, item_id)


def attempts(
    store: Store,
    run_id: str,
    item_id: str | None = None,
    limit: int | None = None,
    after: Any = None,
) -> list[Attempt]:
    """Attempts of the run (or of one item), oldest first (one page with `limit`)."""
    from ledger.reads import paging

    return paging.collect(paging.iter_attempts(store, run_id, item_id, limit, after))


def history(
    store: Store, run_id: str, limit: int | None = None, after: int | None = None
) -> list[Transition]:
    """The run's transitions in position order, from its submit (one page with `limit`)."""
    from ledger.reads import paging

    return paging.collect(paging.iter_history(store, run_id, limit, after))


def lineage(store: Store, run_id: str) -> list[RunStatus]:
    """The runs linked to this one (same root), root first."""
    run_id = A.run_id(run_id)
    with store.read() as tx:
        run = load_run(tx, run_id, lock=False)
        rows = tx.fetchall(SQL.sql(tx, "runs_of_root"), (run.root_run_id,))
        attach_counts(tx, rows)
        return with_signals(tx, rows, [status_of_row(tx, row) for row in rows])


def audit(
    store: Store,
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
    """Transitions filtered by run, actor id, role, target state and time; keyset-paged by
    position. The arguments are checked at once; the pages are read as the caller iterates.

    Webhook changes (registered, changed, removed by an operator: events of no run) are
    in it too, in position order, unless a run or a target state is asked for: their
    `run_id` is empty, their command `webhook_<command>` (`webhook_add`, ...), their
    evidence the webhook as it was after the change (`webhook_transition`)."""
    if run_id is not None:
        run_id = A.run_id(run_id)
    if actor is not None:
        actor = check_identifier(actor, "actor")
    if role is not None and role not in S.ROLES:
        raise InvalidInput(f"role {role!r} is not a role; roles: {', '.join(S.ROLES)}")
    if state is not None and state not in S.RUN_STATES and state not in S.ITEM_STATES:
        raise InvalidInput(f"state {state!r} is neither a run nor an item state")
    for name, value in (("since", since), ("until", until)):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise InvalidInput(f"{name} must be an aware datetime")
    if after is not None and (
        isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63
    ):
        raise InvalidInput("after must be a non-negative position")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput("limit must be a positive integer")
    if (
        isinstance(page_size, bool)
        or not isinstance(page_size, int)
        or not 1 <= page_size <= 10_000
    ):
        raise InvalidInput("page_size must be an integer from 1 to 10000")
    return _audit_pages(
        store,
        _AuditFilter(
            run_id,
            actor,
            role,
            state,
            None if since is None else iso(utc_time(since, "since")),
            None if until is None else iso(utc_time(until, "until")),
        ),
        newest_first,
        after,
        limit,
        page_size,
    )


_NO_POSITION = 2**63 - 1  # above every position: the bound of a read without one
# the role and target states PostgreSQL's partial indexes of the transitions leave out
# (schema v9, on the event log since v17): an audit of one is not led by those indexes
_UNINDEXED_ROLES = frozenset({S.WORKER})
_UNINDEXED_STATES = frozenset({S.IN_PROGRESS, S.ACCEPTED})
_LEADING = {
    "run": ("run_id",),
    "actor": ("actor",),
    "role": ("role",),
    "role_any": ("role",),
    "state": ("state",),
    "state_any": ("state",),
    "at": ("since", "until"),
    "since": ("since",),
}


@dataclass(frozen=True)
class _AuditFilter:
    """The filters of an audit (None: not filtered), times as their stored text."""

    run_id: str | None
    actor: str | None
    role: str | None
    state: str | None
    since: str | None
    until: str | None

    def lead(self, dialect: str) -> str:
        """The lead of the named statement (queries.sql, audit_*): the filter whose index
        the read walks. The run, the actor, a target state or role the store's index
        holds, a time range when nothing else is filtered (SQLite, with no statistics on
        `at`, searches the log's at index and sorts: the `_sorted` statements), else none
        ("all": in position order, each filter checked per row)."""
        if self.run_id is not None:
            return "run"
        if self.actor is not None:
            return "actor"
        # SQLite indexes every target state and role (and, with statistics, knows a
        # state is the more selective); PostgreSQL's partial indexes leave some out
        if self.state is not None and dialect == "sqlite":
            return "state_any"
        if self.state is not None and self.state not in _UNINDEXED_STATES:
            return "state"
        if self.role is not None and dialect == "sqlite":
            return "role_any"
        if self.role is not None and self.role not in _UNINDEXED_ROLES:
            return "role"
        if self.role is not None or self.state is not None:
            return "all"
        if self.until is not None:
            time = "at"
        elif self.since is not None:
            time = "since"
        else:
            return "all"
        return time + "_sorted" if dialect == "sqlite" else time

    def webhook_params(self) -> list[Any] | None:
        """The parameters of audit_webhooks_*, the filters of the webhook changes (each
        given twice); None when the audit holds none (a run or a target state is asked
        for: a webhook change is neither)."""
        if self.run_id is not None or self.state is not None:
            return None
        out: list[Any] = []
        for value in (self.actor, self.role, self.since, self.until):
            out += [value, value]
        return out

    def params(self, lead: str) -> list[Any]:
        """The statement's filter parameters: one for each filter it is led by, two (the
        value twice, or None twice) for each it checks per row; a statement led by time
        has no other filter."""
        base = lead.removesuffix("_sorted")
        leading = _LEADING.get(base, ())
        out: list[Any] = []
        for name in ("run_id", "actor", "role", "state", "since", "until"):
            value = getattr(self, name)
            if name in leading:
                out.append("" if value is None else value)  # a range from '' holds every time
            elif base not in ("at", "since"):
                out += [value, value]
        return out


def _audit_pages(
    store: Store,
    flt: _AuditFilter,
    newest_first: bool,
    after: int | None,
    limit: int | None,
    page_size: int,
) -> Iterator[Transition]:
    lead = flt.lead(store.dialect)
    order = "desc" if newest_first else "asc"
    name = f"audit_{lead}_{order}"
    params = flt.params(lead)
    webhooks = flt.webhook_params()
    cursor = after
    remaining = limit
    while True:
        n = page_size if remaining is None else min(page_size, remaining)
        start = cursor if cursor is not None else (_NO_POSITION if newest_first else -1)
        with store.read() as tx:
            # never past a position a slower writer may still fill in (rule 18)
            bound = tx.readable_position()
            upto = _NO_POSITION if bound is None else bound
            rows = tx.fetchall(SQL.sql(tx, name), (*params, start, upto, n))
            found = [transition(r) for r in rows]
            if webhooks is not None:
                changes = tx.fetchall(
                    SQL.sql(tx, f"audit_webhooks_{order}"), (*webhooks, start, upto, n)
                )
                if changes:
                    # the two reads merged in position order (a position is one event's)
                    found = sorted(
                        found + [webhook_transition(r) for r in changes],
                        key=lambda t: t.position,
                        reverse=newest_first,
                    )[:n]
        yield from found
        if remaining is not None:
            remaining -= len(found)
            if remaining <= 0:
                return
        if len(found) < n:
            return
        cursor = found[-1].position
