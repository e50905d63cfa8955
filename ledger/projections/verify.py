"""`Ledger.verify()`: replay every event and report what is wrong, with run ids and positions.

Three checks, over one consistent point of the history (position P):

1. **Hash chains** (tamper evidence). Events are walked per stream in version
   order; each event's hash is recomputed from its stored bytes and the
   recomputed hash of the event before it, and compared with the hash recorded
   at write time (on the event's row). Reported: an edited event (`hash_chain`),
   a missing hash (`hash_missing`), a deleted event (a version gap, `stream_gap`;
   a stream's last event deleted shows as the projections' drift, check 3, and in
   `heads`) and events whose positions disagree with their versions
   (`stream_order`). `heads` is a digest over every stream's last event and hash:
   record it elsewhere to detect a history rewritten wholesale, hashes included.
2. **the rule book's rules in the history**, checked while replaying in position order:
   every rule of the rule checker (`ledger/core/rule_check.py`, the one the commands
   check before they commit and import, restore and copy check before they write), each
   problem named by its rule (`terminal_changed`, `two_leases`, `success_unearned`,
   `lease_holder`, ...), and events that cannot be applied (`replay`, `undecodable`). Batches are replayed as a rebuild replays them
   (grouped); a batch holding an event that does not apply is rolled back to a
   savepoint and replayed event by event, reporting each such event.
3. **Projections vs a fresh rebuild**: the replay builds scratch tables with a
   private suffix (the same `Replayer` the rebuild uses); each table is compared
   with the live one in the database (`checksums.tables_equal`; `projection`, naming
   the differing rows), and the scratch tables are dropped. The webhook changes
   (`lg_webhook_changes`, which a rebuild leaves alone) are compared with the webhook
   events the replay met instead: a row must say what its event says, every webhook
   event must have its row, and every row written from an event must have it
   (`webhook_change`). The transition columns on the log's rows (ledger/core/recorded.py)
   are compared with the events the replay decodes (`transition_columns`).

Problems are dicts: {"kind", "run_id", "position", "detail", ...}.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import StoredEvent

from ledger.core.archived import archived_record
from ledger.core.validation import stored_payload_problem
from ledger.core.views import VerifyReport
from ledger.core.webhook_events import ROW_COLUMNS, WebhookEvent, change_row, row_values
from ledger.projections.checksums import diff_rows, table_checksum, tables_equal
from ledger.projections.logged import LoggedPages, describe, mismatched, of_events
from ledger.projections.rebuild import (
    ReadAhead,
    Replayer,
    count_events,
    create_tables,
    drop_tables,
    fewer_collections,
    replay_pages,
    settle_ddl,
)
from ledger.projections.replay_rules import Problems, RuleObserver
from ledger.projections.schema import PROJECTION_TABLES, TABLE_KEYS
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import SCRATCH_MARK, Store, Tx
from ledger.stores.hashchain import (
    GENESIS,
    HASH_CHAIN_FROM,
    HeadsDigest,
    as_uuid,
    event_hash,
)

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

PAGE = 2000
BATCH_SIZE = 10_000  # events replayed per transaction, in pages (rebuild.REPLAY_PAGE)


Progress = Callable[[str, int, int], None]


def verify(lg: Ledger, progress: Progress | None = None) -> VerifyReport:
    """Replay every event; report broken hash chains, broken rules of the rule book and projection drift.

    `progress(stage, done, total)` is called as it goes: stage "replay" after each batch
    (events done, events stored), then "compare" and "chains" once each as they start.
    """
    with fewer_collections():
        return _verify(lg, progress or _quiet)


def _quiet(stage: str, done: int, total: int) -> None:
    return None


def _verify(lg: Ledger, progress: Progress) -> VerifyReport:
    store: Store = lg.store
    problems = Problems()
    suffix = SCRATCH_MARK + secrets.token_hex(4)  # its statements are not prepared
    rules = _WebhookEvents(RuleObserver("lg_items" + suffix, problems))
    replayer = Replayer(suffix, observer=rules)
    try:
        with store.write() as tx:
            create_tables(tx, suffix)
            replayer.prepare(tx)
            total = count_events(tx)
        position = done = 0
        progress("replay", 0, total)
        while True:  # catch up in batches, outside any lock
            with store.write() as tx:
                position, n = _replay(tx, replayer, position, problems)
            replayer.committed(position)  # its aggregates serve the next batch
            done += n
            progress("replay", done, max(total, done))
            if n < BATCH_SIZE:
                break
        with _consistent(store) as tx:  # the last events and the comparison see one state
            while True:
                position, n = _replay(tx, replayer, position, problems)
                done += n
                if n < BATCH_SIZE:
                    break
            problems.extend(replayer.problems)
            replayer.problems = []
            events = count_events(tx, position)
            progress("compare", events, events)
            _compare(tx, suffix, problems)
            _compare_webhook_changes(tx, rules.found, problems)
    finally:
        with store.write() as tx:
            drop_tables(tx, suffix)
    progress("chains", events, events)
    archived: list[dict[str, Any]] = []
    with store.read() as tx:
        heads = _check_chains(tx, position, problems, archived)
    found = problems.result()
    return VerifyReport(ok=not found, problems=found, events=events, heads=heads, archived=archived)


def _consistent(store: Store) -> Any:
    """A write transaction that sees one state: PostgreSQL REPEATABLE READ (writers go on);
    SQLite BEGIN IMMEDIATE (writers wait)."""

    @contextmanager
    def tx() -> Iterator[Tx]:
        with store.write() as t:
            if store.dialect == "postgres":
                t.execute(STATEMENTS.sql(t, "pg_repeatable_read"))
            yield t

    return tx()


# --------------------------------------------------------------------------
# replay (position order)
# --------------------------------------------------------------------------
def _replay(tx: Tx, replayer: Replayer, after: int, problems: Problems) -> tuple[int, int]:
    """Replay the next `BATCH_SIZE` events in pages (`replay_pages`: the next page is read
    while the server writes this one's rows); returns (new position, events read)."""
    store: Store = tx.store
    pages = LoggedPages()  # each page with its rows' transition columns

    def apply_page(rows: list[tuple[int, StoredEvent]], after: int, ahead: ReadAhead) -> None:
        events: list[tuple[int, DomainEvent]] = []
        for pos, stored in rows:
            _check_strict_json(store, pos, stored, problems)
            try:
                events.append((pos, cast(DomainEvent, store.mapper.to_domain_event(stored))))
            except Exception as exc:
                problems.add(
                    "undecodable",
                    _run_id_of_stored(store, stored),
                    pos,
                    f"event v{stored.originator_version} of stream {stored.originator_id} does "
                    f"not decode: {type(exc).__name__}: {exc}",
                )
        for pos, want, have in mismatched(of_events(events), pages.take(rows)):
            problems.add(
                "transition_columns",
                want[0] or have[0],
                pos,
                "the transition columns on the event's row disagree with the event "
                "(rebuild_projections writes them again)",
                columns=describe(want, have),
            )
        if events:
            _apply(tx, replayer, events, after, problems, ahead)
        # within the transaction: its aggregates serve the next page
        replayer.committed(rows[-1][0])

    return replay_pages(tx, after, BATCH_SIZE, apply_page, pages)


def _apply(
    tx: Tx,
    replayer: Replayer,
    events: list[tuple[int, DomainEvent]],
    after: int,
    problems: Problems,
    before_write: Callable[[], None] | None = None,
) -> None:
    """Replay a batch as a rebuild does (events grouped), inside a savepoint. If an event
    does not apply (a damaged history: a missing or reordered event), the batch is rolled
    back to the savepoint and replayed event by event, reporting each event that does not
    apply and forcing it through, so the replay goes on to the end."""
    items, dropped = len(problems.items), problems.dropped
    tx.execute(STATEMENTS.sql(tx, "savepoint"))
    try:
        replayer.tolerant = False
        replayer.apply(tx, events, after, before_write=before_write)
    except Exception:
        tx.execute(STATEMENTS.sql(tx, "rollback_to_savepoint"))
        # psycopg forgets its prepared statements on a ROLLBACK: processed late (PostgreSQL's
        # pipeline), its DEALLOCATE ALL would remove the ones the replay below prepares
        settle_ddl(tx)
        del problems.items[items:]  # the rules are checked again, event by event
        problems.dropped = dropped
        replayer.forget()
        replayer.tolerant = True
        replayer.apply(tx, events, before_write=before_write)
    finally:
        replayer.tolerant = False
    tx.execute(STATEMENTS.sql(tx, "release_savepoint"))


def _check_strict_json(store: Store, pos: int, stored: StoredEvent, problems: Problems) -> None:
    """Report an event whose payload is not strict JSON (`stored_payload_problem`)."""
    problem = stored_payload_problem(bytes(stored.state))
    if problem is not None:
        problems.add(
            "not_strict_json",
            _run_id_of_stored(store, stored),
            pos,
            f"event v{stored.originator_version} of stream {stored.originator_id}: {problem}",
        )


def _run_id_of_stored(store: Store, stored: StoredEvent) -> str | None:
    """The run an event belongs to, best effort (for reports on damaged events)."""
    try:
        state = json.loads(bytes(stored.state))
    except (ValueError, TypeError):
        return None
    if isinstance(state, dict) and isinstance(state.get("run_id"), str):
        return str(state["run_id"])
    return str(stored.originator_id)


# --------------------------------------------------------------------------
# projections vs the replay
# --------------------------------------------------------------------------
def _compare(tx: Tx, suffix: str, problems: Problems) -> None:
    for name in PROJECTION_TABLES:
        if tables_equal(tx, name, "", suffix):
            continue
        diffs = diff_rows(tx, name, "", suffix)
        if not diffs:
            key = TABLE_KEYS[name]
            live, fresh = table_checksum(tx, name, key), table_checksum(tx, name + suffix, key)
            problems.add(
                "projection",
                None,
                None,
                f"{name}: checksum {live} differs from a rebuild's {fresh}",
                table=name,
            )
        for d in diffs:
            what = {
                "missing": "is not in a rebuild",
                "extra": "is missing (a rebuild has it)",
                "changed": "differs from a rebuild in " + ", ".join(d["columns"]),
            }[d["change"]]
            problems.add(
                "projection",
                d["run_id"],
                d["key"].get("position"),
                f"{name} row {d['key']} {what}",
                table=name,
                key=d["key"],
            )


# --------------------------------------------------------------------------
# webhook changes vs their events
# --------------------------------------------------------------------------
class _WebhookEvents:
    """The replay's observer: the rule observer's checks, and each webhook event met
    (by position: a batch replayed again after a failed event meets them again)."""

    def __init__(self, rules: RuleObserver) -> None:
        self.rules = rules
        self.found: dict[int, WebhookEvent] = {}

    def __call__(self, tx: Tx, position: int, event: DomainEvent, replayer: Replayer) -> None:
        if isinstance(event, WebhookEvent):
            self.found[position] = event
        self.rules(tx, position, event, replayer)


def _compare_webhook_changes(tx: Tx, events: dict[int, WebhookEvent], problems: Problems) -> None:
    """Each lg_webhook_changes row written from an event says what its event says; each
    webhook event the replay met has its row. In the transaction the replay ended in: a
    row and its event are committed together, so a row it sees without an event is one
    written without one."""
    rows = {
        int(r["position"]): r for r in tx.fetchall(STATEMENTS.sql(tx, "logged_webhook_changes"))
    }
    for position, e in sorted(events.items()):
        row = rows.pop(position, None)
        where = {"table": "lg_webhook_changes", "webhook_id": e.webhook_id}
        if row is None:
            problems.add(
                "webhook_change",
                None,
                position,
                f"the {e.command} of webhook {e.webhook_id} by {e.actor_id} has no "
                "lg_webhook_changes row: it was deleted",
                **where,
            )
            continue
        differ = [
            column
            for column, want, have in zip(
                ROW_COLUMNS, change_row(position, e), row_values(row), strict=True
            )
            if want != have
        ]
        if differ:
            problems.add(
                "webhook_change",
                None,
                position,
                f"the lg_webhook_changes row of the {e.command} of webhook {e.webhook_id} "
                f"differs from its event in {', '.join(differ)}: it was edited",
                **where,
            )
    for position, row in sorted(rows.items()):
        problems.add(
            "webhook_change",
            None,
            position,
            f"lg_webhook_changes has a {row['command']} of webhook {row['webhook_id']} at "
            f"position {position}, where the event log holds no webhook event",
            table="lg_webhook_changes",
            webhook_id=row["webhook_id"],
        )


# --------------------------------------------------------------------------
# hash chains (stream order)
# --------------------------------------------------------------------------
def _stream_rows(tx: Tx, upto: int) -> Iterator[dict[str, Any]]:
    """Every event up to `upto` with its recorded hash, in (stream, version) order."""
    last: tuple[Any, int] | None = None
    while True:
        if last is None:
            rows = tx.fetchall(STATEMENTS.sql(tx, "stream_rows_first"), (upto, PAGE))
        else:
            rows = tx.fetchall(STATEMENTS.sql(tx, "stream_rows_after"), (upto, *last, PAGE))
        yield from rows
        if len(rows) < PAGE:
            return
        last = (rows[-1]["oid"], rows[-1]["version"])


def _check_chains(
    tx: Tx, upto: int, problems: Problems, archived: list[dict[str, Any]] | None = None
) -> str:
    """Walk every stream's chain; returns the heads digest. Runs whose events went to an
    archive are appended to `archived` (where their events went)."""
    if archived is None:
        archived = []
    store: Store = tx.store
    meta = tx.fetchone(STATEMENTS.sql(tx, "meta_value"), (HASH_CHAIN_FROM,))
    chain_from = int(meta["value"]) if meta else 0
    heads = HeadsDigest()
    current: UUID | None = None
    prev_version = prev_position = 0
    prev_recorded = chain = GENESIS
    for r in _stream_rows(tx, upto):
        oid, version, position = as_uuid(r["oid"]), int(r["version"]), int(r["position"])
        state, topic, recorded = bytes(r["state"]), r["topic"], r["hash"]
        if oid != current:
            if current is not None:
                heads.add(current, prev_version, chain)
            current, prev_version, prev_position, prev_recorded, chain = oid, 0, 0, GENESIS, GENESIS
            record = archived_record(topic, state) if version > 1 else None
            if record is not None and isinstance(record.get("head_hash"), str):
                # the run's earlier events went to a verified archive: its chain goes on
                # from the head hash the Archived event recorded (ledger/core/archived.py)
                prev_version, prev_recorded = version - 1, record["head_hash"]
                chain = prev_recorded
                archived.append({**record, "position": position})
        stored = StoredEvent(
            originator_id=oid, originator_version=version, topic=topic, state=state
        )
        where = {"stream": str(oid), "version": version}
        gap = version != prev_version + 1
        if gap:
            problems.add(
                "stream_gap",
                _run_id_of_stored(store, stored),
                position,
                f"stream {oid} jumps from version {prev_version} to {version}: "
                f"{version - prev_version - 1} event(s) deleted"
                if version > prev_version + 1
                else f"stream {oid} repeats version {version}",
                **where,
            )
        if position <= prev_position:
            problems.add(
                "stream_order",
                _run_id_of_stored(store, stored),
                position,
                f"version {version} of stream {oid} is at position {position}, before version "
                f"{prev_version} at position {prev_position}: events were reordered",
                **where,
            )
        # (the recorded chain is the recomputed one until an edit: its hash is the same)
        recomputed = event_hash(chain, oid, version, topic, state)
        recorded_chain = chain == prev_recorded
        chain = recomputed
        if recorded is None:
            if position > chain_from:
                problems.add(
                    "hash_missing",
                    _run_id_of_stored(store, stored),
                    position,
                    f"version {version} of stream {oid} has no recorded hash: it was written "
                    "behind the ledger's back",
                    **where,
                )
            prev_recorded = GENESIS  # before the hash chain existed, or already reported
        else:
            # the hash recorded at write time chains this event's bytes to the recorded
            # hash of the event before it; a gap is reported above and cannot be checked
            if (
                not gap
                and (
                    recomputed
                    if recorded_chain
                    else event_hash(prev_recorded, oid, version, topic, state)
                )
                != recorded
            ):
                problems.add(
                    "hash_chain",
                    _run_id_of_stored(store, stored),
                    position,
                    f"version {version} of stream {oid} does not match the hash recorded when it "
                    "was written: its stored bytes were edited",
                    **where,
                )
            prev_recorded = recorded
        prev_version, prev_position = version, position
    if current is not None:
        heads.add(current, prev_version, chain)
    return heads.hexdigest()
