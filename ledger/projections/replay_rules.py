"""The rule checker (`ledger/core/rule_check.py`) over a replay: the facts before each
event come from the `Replayer` that is about to apply it. `verify` reports every
violation in its problem list (`Problems`); import, restore and copy refuse at the first
(`RuleObserver(refuse=...)`), before anything commits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import DomainEvent

from ledger.core.archived import Archived
from ledger.core.rule_check import ItemFacts, Violation, check_event, run_of
from ledger.projections.counts import required_not_accepted
from ledger.projections.rebuild import Replayer
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import Tx

MAX_PROBLEMS = 1000


class Problems:
    """The list of problems, capped so a badly broken ledger still yields a report."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.dropped = 0

    def add(
        self, kind: str, run_id: str | None, position: int | None, detail: str, **extra: Any
    ) -> None:
        if len(self.items) >= MAX_PROBLEMS:
            self.dropped += 1
            return
        self.items.append(
            {"kind": kind, "run_id": run_id, "position": position, "detail": detail, **extra}
        )

    def extend(self, problems: list[dict[str, Any]]) -> None:
        for p in problems:
            self.add(**p)

    def result(self) -> list[dict[str, Any]]:
        out = list(self.items)
        if self.dropped:
            out.append(
                {
                    "kind": "truncated",
                    "run_id": None,
                    "position": None,
                    "detail": f"{self.dropped} more problems not listed",
                }
            )
        return out


class ReplayFacts:
    """The facts before an event: the replay's run and item aggregates, and its item rows
    (in the tables with `suffix`) for the required items."""

    def __init__(self, tx: Tx, replayer: Replayer, items_table: str, position: int) -> None:
        self.tx = tx
        self.rp = replayer
        self.items_table = items_table
        self.position = position  # the event's: the facts are those of the events before it
        self._flushed = False

    def run_state(self, run_id: str) -> str | None:
        run = self.rp.runs.get(run_id)
        return None if run is None else str(run.state)

    def item(self, stream: UUID) -> ItemFacts | None:
        agg = self.rp.streams.get(stream)
        return agg if agg is not None and hasattr(agg, "lease_token") else None

    def last_time(self, stream: UUID) -> datetime | None:
        agg = self.rp.streams.get(stream)
        return None if agg is None else agg.modified_on

    def item_counts(self, run_id: str) -> Mapping[str, int] | None:
        self._flush()
        run = self.rp.runs.get(run_id)
        return None if run is None else run.counts

    def required_not_accepted(self, run_id: str) -> list[tuple[str, str]]:
        self._flush()
        rows = required_not_accepted(self.tx, run_id, 5, self.items_table)
        return [(r["item_id"], r["state"]) for r in rows]

    def run(self, run_id: str) -> Any:
        return self.rp.runs.get(run_id)

    def amended_by(self, run_id: str, actor_id: str) -> bool:
        self._flush()
        sql = STATEMENTS.sql(self.tx, "run_amended_by")
        return self.tx.fetchone(sql, (run_id, actor_id, self.position)) is not None

    def _flush(self) -> None:
        # the counts and item rows as of the previous event (a grouped replay defers them)
        if not self._flushed:
            self.rp.flush(self.tx)
            self._flushed = True


class RuleObserver:
    """The replay's observer: checks each event before the replayer applies it. With
    `refuse`, the first violation is handed to it (it raises); otherwise each goes into
    `problems`."""

    def __init__(
        self,
        items_table: str,
        problems: Problems | None = None,
        refuse: Callable[[int, Violation], None] | None = None,
    ) -> None:
        self.items_table = items_table
        self.problems = problems
        self.refuse = refuse

    def __call__(self, tx: Tx, position: int, event: DomainEvent, replayer: Replayer) -> None:
        e = event
        if isinstance(e, Archived):
            if self.problems is not None:
                # The run's history went to a verified archive (checked when it was written).
                # Events of it still here are ones an interrupted archive has not deleted
                # yet: a partial history, whose rule checks say nothing. Its chains are
                # still walked.
                run_id = run_of(e)
                self.problems.items = [p for p in self.problems.items if p["run_id"] != run_id]
            return
        facts = ReplayFacts(tx, replayer, self.items_table, position)
        found = check_event(e, facts, first=self.refuse is not None)
        for v in found:
            if self.refuse is not None:
                self.refuse(position, v)
            elif self.problems is not None:
                self.problems.add(
                    v.rule,
                    v.run_id,
                    position,
                    f"{v.event} (v{v.version}): {v.detail}",
                    stream=v.stream,
                    version=v.version,
                )
