"""`ledger top` (registered on the app by `ledger/cli/entry.py`): the overview in the terminal,
refreshing, its runs in the attention order the operator page uses too
(`ledger.reads.attention`): stuck runs (stalled, expired leases) first, then the longest
waits on a person, then on workers."""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ledger.cli.app import JsonOpt, _emit_json, _ledger, _refuse_key, app

if TYPE_CHECKING:
    from ledger.reads.overview import Overview


def _ago(now: datetime, then: datetime | None) -> str:
    if then is None:
        return ""
    s = max(0, int((now - then).total_seconds()))
    if s < 60:
        return f"{s}s"
    m = s // 60
    if m < 60:
        return f"{m}m {s % 60:02d}s"
    h = m // 60
    if h < 48:
        return f"{h}h {m % 60:02d}m"
    return f"{h // 24}d {h % 24}h"


def render_overview(ov: Overview, table: bool = True) -> Any:
    """The overview as one rich renderable: the tallies, then (with `table`) the runs
    needing attention."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ledger.reads.signals import OWNERS

    head = Text()
    head.append(f"{ov.open_runs} open runs", style="bold")
    head.append(f"  at {ov.at:%Y-%m-%d %H:%M:%SZ}")
    if ov.age_seconds:  # a snapshot's (the live view's): read that long ago
        head.append(f" ({ov.age_seconds:.0f}s old)")
    head.append("\n")
    head.append("by state: ")
    head.append(", ".join(f"{s.replace('_', ' ')} {n}" for s, n in ov.by_state.items() if n) or "-")
    head.append("\nwaiting on: ")
    parts = []
    for who in OWNERS:
        n = ov.by_waiting_on.get(who, 0)
        if not n:
            continue
        oldest = ov.oldest_wait.get(who)
        parts.append(f"{who} {n}" + (f" (oldest {_ago(ov.at, oldest.since)})" if oldest else ""))
    head.append(", ".join(parts) or "-")
    head.append("\n")
    head.append(f"stalled {ov.stalled}", style="bold red" if ov.stalled else "")
    head.append("   ")
    head.append(
        f"expired leases {ov.expired_leases} in {ov.runs_with_expired_leases} runs",
        style="bold red" if ov.expired_leases else "",
    )
    if not table:
        return head
    grid = Table(title=TITLE, title_justify="left")
    for col in COLUMNS:
        # a run id and its flags stay whole on a narrow screen (the others give way)
        grid.add_column(col, no_wrap=col in ("run", "flags"))
    for row in overview_rows(ov, markup=True):
        grid.add_row(*row)
    return Group(head, grid)


TITLE = "needs attention first (stuck, then the longest waits)"
COLUMNS = ("run", "state", "waiting on", "for", "last activity", "flags", "scope")


def overview_rows(ov: Overview, markup: bool) -> list[tuple[str, ...]]:
    """The overview's stuck runs and longest waits in the attention order: one row each."""
    from rich.markup import escape

    from ledger.reads.attention import by_attention

    rows: list[tuple[str, ...]] = []
    runs = {run.run_id: run for run in [*ov.stuck, *ov.longest_waiting]}
    for run in sorted(runs.values(), key=by_attention):
        flags = []
        if run.stalled:
            flags.append("[bold red]STALLED[/]" if markup else "STALLED")
        if run.expired_leases:
            text = f"{run.expired_leases} EXPIRED"
            flags.append(f"[bold red]{text}[/]" if markup else text)
        rows.append(
            (
                escape(run.run_id) if markup else run.run_id,
                run.state,
                run.waiting_on,
                _ago(ov.at, run.waiting_since),
                _ago(ov.at, run.last_activity_at) + " ago" if run.last_activity_at else "",
                " ".join(flags),
                escape(run.scope) if markup else run.scope,
            )
        )
    return rows


@app.command()
def top(
    ctx: typer.Context,
    interval: Annotated[
        float, typer.Option("--interval", min=0.5, help="Seconds between refreshes")
    ] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What is stuck, on whom: the overview of every open run, its runs most urgent first
    (the operator page's order), refreshing until Ctrl-C (`--json`: the overview once, as
    one JSON document)."""
    from rich.live import Live

    from ledger.cli.render import console
    from ledger.reads.overview import OverviewSnapshot

    _refuse_key(ctx, "--idempotency-key names a command; top only reads")
    out = console()
    with _ledger(ctx) as lg:
        if as_json:
            _emit_json(lg.overview())
            return
        if once:
            ov = lg.overview()
            if out.is_terminal:
                out.print(render_overview(ov))
                return
            # in a pipe: the tallies, then a plain table (whole ids, no borders)
            from ledger.cli.render import Grid

            out.print(render_overview(ov, table=False))
            grid = Grid(TITLE, [(c, False) for c in COLUMNS], short=False)
            for row in overview_rows(ov, markup=True):  # the grid reads the markup
                grid.add(*row)
            grid.print(out)
            return
        # each frame from a snapshot read again in the background once `interval` old (its
        # age in the header): a frame never waits for the store, which reads one overview
        # per interval however long that read takes (ledger/reads/overview.py)
        snapshot = OverviewSnapshot(lg.store, max_age=interval)
        with Live(render_overview(snapshot.get()), console=out, screen=False) as live:
            try:
                while True:
                    time.sleep(interval)
                    live.update(render_overview(snapshot.get()))
            except KeyboardInterrupt:
                pass
