"""The projector: applies events to the projection tables.

The same code runs inside each command's transaction (so reads are current as
soon as a command returns) and in a rebuild from the first event, which is why a
rebuild yields tables identical to the live ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from eventsourcing.domain import DomainEvent

from ledger.core.archived import Archived
from ledger.core.domain import Item, Run
from ledger.core.rows import (
    ITEM_STREAM_COLUMNS,
    RUN_COLUMNS,
    dumps,
    iso,
    item_stream_values,
    run_to_row,
)
from ledger.core.states import IN_PROGRESS, PENDING, TERMINAL_RUN_STATES
from ledger.core.webhook_events import WebhookEvent, change_row
from ledger.projections.counts import slot_of
from ledger.projections.sql import STATEMENTS
from ledger.stores import statements as rows_sql


class Cursor(Protocol):
    """What the projector needs from a store transaction (qmark placeholders)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...


REVERSE = {
    "retry_of": "retried_by",
    "repair_of": "repaired_by",
    "correction_of": "corrected_by",
    "compensates": "compensated_by",
}


class Projector:
    """Writes run, item and attempt rows for a batch of events (a transition's own columns
    are on its event's row: ledger/core/recorded.py), and the
    `lg_webhook_changes` row of each webhook event.

    A webhook event's row is written by the live projector only (no `suffix`: the
    commands, import, restore): `lg_webhook_changes` is no table a rebuild replaces (it
    keeps the changes recorded before the event log held them), and verify compares it
    with the events instead (ledger/projections/verify.py)."""

    def __init__(self, suffix: str = "") -> None:
        self.webhook_changes = suffix == ""
        self.insert_webhook_change = STATEMENTS.common("insert_webhook_change")
        self.runs_table = "lg_runs" + suffix
        self.items_table = "lg_items" + suffix
        self.attempts_table = "lg_attempts" + suffix
        self.counts_table = "lg_run_counts" + suffix
        # each written out in its one-row and its bulk form (ledger/stores/statements.py)
        self.upsert_run = rows_sql.insert(
            self.runs_table,
            RUN_COLUMNS,
            tail=rows_sql.on_conflict_update(
                ("run_id",), [c for c in RUN_COLUMNS if c != "run_id"]
            ),
        )
        self.update_item = rows_sql.update(
            self.items_table, ITEM_STREAM_COLUMNS, ("run_id", "item_id")
        )
        self.insert_item = rows_sql.insert(
            self.items_table,
            (
                "run_id",
                "item_id",
                "seq",
                "required",
                "payload",
                "in_manifest",
                "state",
                "revision",
                "attempts",
            ),
            {"in_manifest": 1, "state": PENDING, "revision": 0, "attempts": 0},
        )
        self.replace_item = rows_sql.update(
            self.items_table, ("required", "payload"), ("run_id", "item_id")
        )
        self.withdraw_item = STATEMENTS.common("withdraw_item", items=self.items_table)
        # an attempt's row is written once, when it ends; the open one is the item row's
        # lease (the reads of attempts add it: ledger/reads/queries.sql)
        self.insert_attempt = rows_sql.insert(
            self.attempts_table,
            (
                "run_id",
                "item_id",
                "attempt",
                "worker_id",
                "lease_token",
                "started_at",
                "expires_at",
                "finished_at",
                "stage",
                "outcome",
                "error",
            ),
        )
        # an open run's item counts: signed deltas per slot and state (ledger/projections/counts.py)
        self.add_counts = rows_sql.insert(
            self.counts_table,
            ("run_id", "slot", "state", "n"),
            tail=rows_sql.on_conflict_add(self.counts_table, ("run_id", "slot", "state"), "n"),
        )
        self.drop_counts = STATEMENTS.common("drop_counts", counts=self.counts_table)
        # an archived run's rows go with its events (its run row stays)
        self.delete_run_rows = [
            STATEMENTS.common("delete_run_rows", table=t)
            for t in (self.items_table, self.attempts_table)
        ]

    def project(
        self,
        cur: Cursor,
        events: Sequence[tuple[int, DomainEvent]],
        runs: dict[str, Run],
        items: dict[tuple[str, str], Item],
    ) -> int:
        """Write the rows for `events` (already applied to `runs` and `items`); the number
        of item rows inserted.

        `runs` must hold the run of every event and any run an event links to;
        `items` must hold every item an item event touches.
        """
        item_inserts: list[tuple[Any, ...]] = []
        item_replaces: list[tuple[Any, ...]] = []
        item_withdraws: list[tuple[Any, ...]] = []
        attempt_inserts: list[tuple[Any, ...]] = []
        touched_runs: dict[str, Run] = {}
        touched_items: dict[tuple[str, str], Item] = {}
        archived: list[tuple[str]] = []
        webhook_changes: list[tuple[Any, ...]] = []
        # (run_id, slot, state) -> delta; a run that ends here folds its counts into its row
        count_deltas: dict[tuple[str, int, str], int] = {}
        folded: set[str] = set()

        def count(run_id: str, at: str | None, state: str, n: int) -> None:
            assert at is not None
            key = (run_id, slot_of(at), state)
            count_deltas[key] = count_deltas.get(key, 0) + n

        # a command's events share one time: its text is made once (the time is compared,
        # an equal time gives the same UTC text)
        last_time: Any = None
        at: str | None = None
        for position, e in events:
            if e.timestamp != last_time or at is None:
                last_time, at = e.timestamp, iso(e.timestamp)
            if isinstance(e, Run.Submitted):
                run = runs[e.run_id]
                run.seq = position
                touched_runs[e.run_id] = run
                count(e.run_id, at, PENDING, len(e.manifest["items"]))
                for seq, it in enumerate(e.manifest["items"]):
                    item_inserts.append(
                        (
                            e.run_id,
                            it["item_id"],
                            seq,
                            int(it["required"]),
                            dumps(it.get("payload")),
                        )
                    )
                for link in e.links:
                    original = runs.get(link["run_id"])
                    if original is not None and link["relation"] in REVERSE:
                        original.links = [
                            *original.links,
                            {"relation": REVERSE[link["relation"]], "run_id": e.run_id},
                        ]
                        touched_runs[original.run_id] = original
            elif isinstance(e, Run.Transitioned):
                run = runs[str(e.originator_id)]
                touched_runs[run.run_id] = run
                if e.to_state in TERMINAL_RUN_STATES:
                    folded.add(run.run_id)
            elif isinstance(e, Run.Amended):
                run = runs[str(e.originator_id)]
                touched_runs[run.run_id] = run
                first_seq = run.item_count - len(e.added)
                if e.added:
                    count(run.run_id, at, PENDING, len(e.added))
                for i, it in enumerate(e.added):
                    item_inserts.append(
                        (
                            run.run_id,
                            it["item_id"],
                            first_seq + i,
                            int(it["required"]),
                            dumps(it.get("payload")),
                        )
                    )
                for it in e.replaced:
                    item_replaces.append(
                        (int(it["required"]), dumps(it.get("payload")), run.run_id, it["item_id"])
                    )
                for item_id in e.withdraw:
                    item_withdraws.append((run.run_id, item_id))
            elif isinstance(e, Item.Registered):
                touched_items[(e.run_id, e.item_id)] = items[(e.run_id, e.item_id)]
            elif isinstance(e, Item.Transitioned):
                key = (e.run_id, e.item_id)
                item = items[key]
                touched_items[key] = item
                # the run's row is not written: its counts move in lg_run_counts (exact in
                # memory only where the command holds the run row FOR UPDATE)
                run = runs[e.run_id]
                run.counts[e.from_state] -= 1
                run.counts[e.to_state] += 1
                count(e.run_id, at, e.from_state, -1)
                count(e.run_id, at, e.to_state, 1)
                ev = e.evidence
                if e.from_state == IN_PROGRESS and e.command != "claim":
                    # the attempt ended: its one row, the lease from the item's aggregate
                    # (None only in a replay of a history missing the claim)
                    lease = item.ended_leases.get(ev["attempt"])
                    if lease is not None:
                        attempt_inserts.append(
                            (
                                e.run_id,
                                e.item_id,
                                ev["attempt"],
                                lease.worker_id,
                                lease.lease_token,
                                iso(lease.started_on),
                                lease.expires_at,
                                at,
                                ev.get("stage"),
                                ev.get("outcome"),
                                ev.get("error"),
                            )
                        )
            elif isinstance(e, Archived):
                # the run's events left for an archive: its rows go with them, its run row
                # (final state, counts, links) stays as the event carries it
                archived.append((e.run_id,))
                folded.add(e.run_id)
                touched_runs[e.run_id] = runs[e.run_id]
                for link in e.links:  # its submit may be gone: keep the linked run's back link
                    original = runs.get(link["run_id"])
                    back = {"relation": REVERSE.get(link["relation"], ""), "run_id": e.run_id}
                    if (
                        original is not None
                        and link["relation"] in REVERSE
                        and back not in original.links
                    ):
                        original.links = [*original.links, back]
                        touched_runs[original.run_id] = original
            elif isinstance(e, WebhookEvent):
                if self.webhook_changes:
                    webhook_changes.append((*change_row(position, e), e.webhook_id))
            elif isinstance(e, Item.LeaseExtended):
                # the lease's new expiry: the item row only (the open attempt is read from it)
                key = (e.run_id, e.item_id)
                touched_items[key] = items[key]

        if webhook_changes:
            cur.executemany(self.insert_webhook_change, webhook_changes)
        if item_inserts:
            cur.executemany(self.insert_item, item_inserts)
        if item_replaces:
            cur.executemany(self.replace_item, item_replaces)
        if item_withdraws:
            cur.executemany(self.withdraw_item, item_withdraws)
        if attempt_inserts:
            cur.executemany(self.insert_attempt, attempt_inserts)
        if count_deltas:
            # in key order, so two transactions upserting the same rows never deadlock
            rows = [(*key, n) for key, n in sorted(count_deltas.items()) if key[0] not in folded]
            if rows:
                cur.executemany(self.add_counts, rows)
        if folded:
            # the run ended: its totals go into its row (run_to_row), its slot rows go
            cur.executemany(self.drop_counts, [(run_id,) for run_id in sorted(folded)])
        if archived:
            for delete in self.delete_run_rows:
                cur.executemany(delete, archived)
        if touched_runs:
            cur.executemany(self.upsert_run, [run_to_row(r) for r in touched_runs.values()])
        if touched_items:
            for it in touched_items.values():
                it.ended_leases.clear()  # their rows are made: the aggregate need not keep them
            cur.executemany(
                self.update_item,
                [(*item_stream_values(it), it.run_id, it.item_id) for it in touched_items.values()],
            )
        return len(item_inserts)
