"""Human tables for the `ledger` command (rich). Imported only when a table is shown."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Colours for states; anything not listed is shown plain.
_STATE_STYLE = {
    "succeeded": "green",
    "accepted": "green",
    "completed_with_errors": "yellow",
    "quarantined": "yellow",
    "retryable": "yellow",
    "pausing": "yellow",
    "paused": "yellow",
    "awaiting_review": "cyan",
    "failed": "red",
    "rejected": "red",
    "canceled": "magenta",
    "canceling": "magenta",
    "skipped": "dim",
}


def console() -> Console:
    """A console on the current stdout (so test runners that swap stdout see the output).

    Piped output is not folded to 80 columns: ids and timestamps stay on one line.
    """
    import os
    import sys

    width = None
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        width = 200
    return Console(highlight=False, width=width)


def state(text: str | None) -> str:
    """A state with its colour as rich markup."""
    if not text:
        return ""
    style = _STATE_STYLE.get(text)
    return f"[{style}]{text}[/]" if style else text


def when(value: datetime | None) -> str:
    """A timestamp to the second, without the noise."""
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def counts(values: dict[str, int]) -> str:
    """`accepted 18, skipped 2` in a stable order, zeros left out."""
    order = [
        "pending",
        "in_progress",
        "retryable",
        "quarantined",
        "accepted",
        "rejected",
        "skipped",
    ]
    keys = [k for k in order if values.get(k)] + sorted(
        k for k in values if k not in order and values[k]
    )
    return ", ".join(f"{k} {values[k]}" for k in keys) or "no items"


def links(values: Iterable[Any]) -> str:
    """`repair_of 1f2e…` for each link."""
    return ", ".join(f"{link.relation} {link.run_id}" for link in values)


def show_status(out: Console, status: Any) -> None:
    """One run: its state, counts, what it waits on, and the items not accepted."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    failure = ""
    if status.failure_kind:
        failure = f" ({status.failure_kind}, {status.failure_reason})"
    cancel = " (cancel requested)" if status.cancel_requested and status.state != "canceled" else ""
    rows: list[tuple[str, str]] = [
        ("run", escape(status.run_id)),
        ("state", state(status.state) + failure + cancel),
        ("waiting on", status.waiting_on),
        ("summary", escape(status.summary)),
        ("items", counts(status.counts)),
        ("revision", str(status.revision)),
        ("input version", status.input_version),
    ]
    optional = [
        ("source", getattr(status, "source_version", "")),
        ("config", getattr(status, "config_version", "")),
        ("scope", getattr(status, "scope", "")),
        ("created by", getattr(status, "created_by", "")),
    ]
    rows += [(k, escape(v)) for k, v in optional if v]
    rows.append(("created", when(status.created_at)))
    rows.append(("updated", when(status.updated_at)))
    if status.links:
        rows.append(("links", escape(links(status.links))))
    review = getattr(status, "review", None)
    if review:
        rows.append(("review", escape(json.dumps(review, default=str))))
    for key, value in rows:
        grid.add_row(key, value)
    out.print(grid)
    if status.not_accepted:
        table = Table(title="not accepted", title_justify="left")
        for col in ("item", "state", "required", "reason"):
            table.add_column(col)
        for item in status.not_accepted:
            table.add_row(
                escape(item.item_id),
                state(item.state),
                "yes" if item.required else "no",
                escape(item.reason or ""),
            )
        out.print(table)


def show_runs(out: Console, runs: Sequence[Any], title: str = "runs") -> None:
    """Runs as a table, one line each."""
    table = Table(title=title, title_justify="left")
    for col in ("run", "state", "items", "waiting on", "links", "updated"):
        table.add_column(col, overflow="fold")
    for run in runs:
        table.add_row(
            escape(run.run_id),
            state(run.state),
            counts(run.counts),
            run.waiting_on,
            escape(links(run.links)),
            when(run.updated_at),
        )
    out.print(table)
    if not runs:
        out.print("no runs")


def show_items(out: Console, items: Sequence[Any]) -> None:
    """A run's items as a table."""
    table = Table(title=f"{len(items)} item(s)", title_justify="left")
    for col in ("item", "state", "required", "attempts", "lease until", "reason / last error"):
        table.add_column(col, overflow="fold")
    for item in items:
        lease = when(item.lease.expires_at) if item.lease else ""
        detail = getattr(item, "reason", None) or item.last_error or ""
        table.add_row(
            escape(item.item_id),
            state(item.state),
            "yes" if item.required else "no",
            str(item.attempts),
            lease,
            escape(detail),
        )
    out.print(table)


def show_attempts(out: Console, attempts: Sequence[Any]) -> None:
    """Attempts as a table, in the order the ledger returned them."""
    table = Table(title=f"{len(attempts)} attempt(s)", title_justify="left")
    for col in ("item", "#", "worker", "started", "finished", "stage", "outcome", "error"):
        table.add_column(col, overflow="fold")
    for a in attempts:
        table.add_row(
            escape(a.item_id),
            str(a.attempt),
            escape(a.worker_id),
            when(a.started_at),
            when(a.finished_at),
            escape(a.stage or ""),
            state(a.outcome) if a.outcome else "in flight",
            escape(a.error or ""),
        )
    out.print(table)


def show_transitions(
    out: Console, transitions: Sequence[Any], title: str, with_run: bool = False
) -> None:
    """Transitions (history or audit) as a table."""
    table = Table(title=f"{title}: {len(transitions)} transition(s)", title_justify="left")
    columns = (
        ["pos", "at"] + (["run"] if with_run else []) + ["item", "from", "to", "actor", "reason"]
    )
    for col in columns:
        table.add_column(col, overflow="fold")
    for t in transitions:
        row = (
            [str(t.position), when(t.at)]
            + ([escape(t.run_id)] if with_run else [])
            + [
                escape(t.item_id or "(run)"),
                t.from_state,
                state(t.to_state),
                escape(f"{t.actor_id}:{t.role}"),
                escape(t.reason or ""),
            ]
        )
        table.add_row(*row)
    out.print(table)


def show_verify(out: Console, report: Any) -> None:
    """The verify report: ok, or every problem found."""
    for a in getattr(report, "archived", None) or ():  # events that left for an archive
        out.print(
            f"archived: run {a['run_id']}: {a['events']} event(s) in {escape(str(a['archive']))} "
            f"(sha256 {str(a['archive_sha256'])[:12]}), at position {a['position']}",
            highlight=False,
        )
    if report.ok:
        out.print(f"[green]ok[/]: {report.events} event(s) replayed, no problems")
        return
    out.print(f"[red]{len(report.problems)} problem(s)[/] in {report.events} event(s):")
    for problem in report.problems:
        out.print(" - " + escape(json.dumps(problem, default=str, ensure_ascii=False)))
