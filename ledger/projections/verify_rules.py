"""What `verify` reports and the the rule book's rules it checks over the history (check 2 of
ledger/projections/verify.py): the capped problem list and the rule checker the replay calls
before it applies each event.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.domain import CanInitAggregate, DomainEvent

from ledger.core import states as S
from ledger.core.archived import Archived
from ledger.core.domain import Item, Run
from ledger.projections.counts import required_not_accepted
from ledger.projections.rebuild import Replayer
from ledger.stores.base import Tx

MAX_PROBLEMS = 1000
_SUCCESS_STATES = frozenset({S.ACCEPTED, S.SUCCEEDED, S.COMPLETED_WITH_ERRORS})


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


class RuleChecker:
    """the rule book's rules over the history, checked before each event is applied."""

    def __init__(self, problems: Problems, suffix: str) -> None:
        self.problems = problems
        self.items_table = "lg_items" + suffix

    def __call__(self, tx: Tx, position: int, event: DomainEvent, replayer: Replayer) -> None:
        e, rp = event, replayer
        run_id = str(getattr(e, "run_id", None) or e.originator_id)
        if isinstance(e, Archived):
            # The run's history went to a verified archive (checked when it was written).
            # Events of it still here are ones an interrupted archive has not deleted yet:
            # a partial history, whose rule checks say nothing. Its chains are still walked.
            self.problems.items = [p for p in self.problems.items if p["run_id"] != run_id]
            return
        run = rp.runs.get(run_id)
        created = isinstance(e, CanInitAggregate)
        agg = None if created else rp.streams.get(e.originator_id)
        add = self.problems.add
        if agg is not None and e.timestamp < agg.modified_on:
            add(
                "time_backwards",
                run_id,
                position,
                f"{type(e).__qualname__} v{e.originator_version} is stamped {e.timestamp.isoformat()}, before "
                f"the previous event of its stream ({agg.modified_on.isoformat()})",
            )
        if run is not None and S.is_terminal(run.state) and not created:
            if isinstance(e, (Run.Transitioned, Run.Amended)):
                add(
                    "terminal_changed",
                    run_id,
                    position,
                    f"run was {run.state} (terminal) and then recorded {_describe(e)}",
                )
            elif getattr(e, "item_id", None) is not None:
                add(
                    "terminal_changed",
                    run_id,
                    position,
                    f"item {getattr(e, 'item_id', None)!r} changed ({_describe(e)}) after its run "
                    f"was {run.state} (terminal)",
                )
        if isinstance(e, Item.Transitioned) and e.command == "claim":
            item = rp.items.get((e.run_id, e.item_id))
            if (item is not None and item.state == S.IN_PROGRESS) or e.from_state == S.IN_PROGRESS:
                add(
                    "two_leases",
                    run_id,
                    position,
                    f"item {e.item_id!r} was claimed by {e.actor_id} while the lease of attempt "
                    f"{item.attempts if item else '?'} ({item.lease_worker if item else '?'}) was live",
                )
        if (
            getattr(e, "role", None) == S.RECONCILER
            and getattr(e, "to_state", None) in _SUCCESS_STATES
        ):
            add(
                "reconciler_success",
                run_id,
                position,
                f"the reconciler {getattr(e, 'actor_id', '?')} recorded {_describe(e)}; only the party that "
                "did the work may record success",
            )
        if isinstance(e, Run.Transitioned) and e.to_state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
            self._check_success(tx, position, e, run, rp)

    def _check_success(
        self, tx: Tx, position: int, e: Run.Transitioned, run: Run | None, rp: Replayer
    ) -> None:
        run_id = str(e.originator_id)
        rp.flush(
            tx
        )  # the counts and item rows as of the previous event (grouped replay defers them)
        if run is not None:
            open_ = {
                s: run.counts[s]
                for s in (S.PENDING, S.IN_PROGRESS, S.RETRYABLE)
                if run.counts.get(s)
            }
            if open_:
                self.problems.add(
                    "success_unearned",
                    run_id,
                    position,
                    f"run recorded {e.to_state} with work still open: "
                    + ", ".join(f"{n} {s}" for s, n in open_.items()),
                )
        if e.to_state != S.SUCCEEDED:
            return
        rows = required_not_accepted(tx, run_id, 5, self.items_table)
        if rows:
            self.problems.add(
                "success_unearned",
                run_id,
                position,
                "run recorded succeeded but required items were not accepted: "
                + ", ".join(f"{r['item_id']} ({r['state']})" for r in rows),
            )


def _describe(e: DomainEvent) -> str:
    cmd = getattr(e, "command", None) or type(e).__name__.lower()
    to = getattr(e, "to_state", None)
    return f"{cmd}" + (f" -> {to}" if to else "") + f" (v{e.originator_version})"
