"""Human tables for the `ledger` command (rich). Imported only when a table is shown."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ledger.core.views import RunStatus, VerifyReport

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


_TERMINAL = frozenset({"succeeded", "completed_with_errors", "failed", "canceled"})


def console(wide: bool = False) -> Console:
    """A console on the current stdout (so test runners that swap stdout see the output).

    Piped output is not folded to 80 columns: ids and timestamps stay on one line.
    `wide` on a terminal: tables as wide as their content (the terminal wraps the long
    lines itself, so every id stays whole for copying).
    """
    import os
    import sys

    width = None
    if sys.stdout.isatty():
        width = 1000 if wide else None
    elif "COLUMNS" not in os.environ:
        width = 200
    return _PipeConsole(highlight=False, width=width)


class _PipeConsole(Console):
    """A reader that goes away (`ledger history RUN | head`) is its choice, not an error:
    rich's default exits 1 there; this one silences stdout and lets the CLI exit 0."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


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


def show_status(out: Console, status: RunStatus) -> None:
    """One run: its state, counts, what it waits on, and the items not accepted."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    failure = ""
    if status.failure_kind:
        failure = f" ({status.failure_kind}, {status.failure_reason})"
    cancel = " (cancel requested)" if status.cancel_requested and status.state != "canceled" else ""
    owner = status.waiting_on
    actors = getattr(status, "waiting_on_actors", None)
    if actors:
        owner += f" ({escape(', '.join(actors))})"
    if getattr(status, "stalled", False):
        owner += " [bold red]STALLED[/]"
    expired = getattr(status, "expired_leases", 0)
    if expired:
        owner += f" [bold red]{expired} expired lease{'s' if expired > 1 else ''}[/]"
    rows: list[tuple[str, str]] = [
        ("run", escape(status.run_id)),
        ("state", state(status.state) + failure + cancel),
        ("waiting on", owner),
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
    rows += _times(status)
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


def _times(status: Any) -> list[tuple[str, str]]:
    """Started, stopped and why, and for an open run: waiting since, activity, rate, ETA."""
    rows: list[tuple[str, str]] = []
    for label, name in (
        ("started", "started_at"),
        ("stopped", "stopped_at"),
        ("waiting since", "waiting_since"),
        ("last activity", "last_activity_at"),
    ):
        value = getattr(status, name, None)
        if value is not None and not (name == "waiting_since" and status.stopped_at):
            rows.append((label, when(value)))
    if getattr(status, "stop_reason", None):
        rows.append(("stop reason", escape(status.stop_reason)))
    if status.state not in _TERMINAL and getattr(status, "last_activity_at", None) is not None:
        rows.append(("rate", f"{getattr(status, 'rate', 0.0):g} items/min (last 5 min)"))
        eta = getattr(status, "eta", None)
        rows.append(("eta", when(eta) if eta is not None else "none (no items finishing)"))
    return rows


# -- tables: full on a pipe or with --wide; short ids and one line per row on a terminal --

SHORT_ID = 8  # characters of a run id shown on a terminal (more when two would collide)

# Count names on a terminal when the full ones do not fit.
_ABBREV = {
    "pending": "pend",
    "in_progress": "busy",
    "retryable": "retry",
    "quarantined": "quar",
    "accepted": "acc",
    "rejected": "rej",
    "skipped": "skip",
}


def short_ids(ids: Iterable[str | None], length: int = SHORT_ID) -> dict[str, str]:
    """Each id -> its shortest prefix of at least `length` characters that no other id
    of `ids` shares (so a short id still names one run)."""
    distinct = sorted({i for i in ids if i})
    if not distinct:
        return {}
    n = length
    longest = max(len(i) for i in distinct)
    while n < longest and len({i[:n] for i in distinct}) < len(distinct):
        n += 1
    return {i: i[:n] for i in distinct}


def when_short(value: datetime | None, now: datetime | None = None) -> str:
    """A timestamp in as few characters as stay clear: the time today, the day and
    minute this year, else the date (UTC, like `when`)."""
    if value is None:
        return ""
    value = value.astimezone(UTC)
    now = (now or datetime.now(UTC)).astimezone(UTC)
    if value.date() == now.date():
        return value.strftime("%H:%M:%S")
    if value.year == now.year:
        return value.strftime("%m-%d %H:%M")
    return value.strftime("%Y-%m-%d")


class Cell:
    """A table cell with an optional shorter form, used on a terminal when the full
    one does not fit (`accepted 17` -> `acc 17`)."""

    __slots__ = ("compact", "full")

    def __init__(self, full: str, compact: str | None = None) -> None:
        self.full = full
        self.compact = compact if compact is not None else full


class Grid:
    """Rows of a table; columns marked `flex` give way (shorter form, then an
    ellipsis) so that on a terminal every row stays on one line."""

    def __init__(self, title: str, columns: Sequence[tuple[str, bool]], short: bool) -> None:
        self.title = title
        self.columns = list(columns)
        self.short = short
        self.rows: list[list[str | Cell]] = []

    def add(self, *cells: str | Cell) -> None:
        self.rows.append(list(cells))

    def print(self, out: Console) -> None:
        if not out.is_terminal:
            self._plain(out)
            return
        if not self.short:
            table = Table(title=self.title, title_justify="left")
            for name, _flex in self.columns:
                table.add_column(name, overflow="fold")
            for row in self.rows:
                table.add_row(*(c.full if isinstance(c, Cell) else c for c in row))
            out.print(table)
            return
        out.print(self._fitted(out.width))

    def _plain(self, out: Console) -> None:
        """For a pipe or a file: no borders, no colours, no title, every value whole, the
        columns aligned with two spaces and no trailing blanks (`awk '{print $1}'` gives
        the first column, the header line first)."""
        rows = [[name.upper().replace(" ", "_") for name, _f in self.columns]]
        for row in self.rows:
            rows.append([Text.from_markup(c.full if isinstance(c, Cell) else c).plain for c in row])
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        out.file.write("\n".join(lines) + "\n")
        out.file.flush()

    def _fitted(self, width: int) -> Table:
        def cell_len(c: str | Cell, compact: bool) -> int:
            text = (c.compact if compact else c.full) if isinstance(c, Cell) else c
            return Text.from_markup(text).cell_len

        n = len(self.columns)
        natural = [
            max([len(name)] + [cell_len(r[i], False) for r in self.rows])
            for i, (name, _f) in enumerate(self.columns)
        ]
        flex = [i for i, (_n, f) in enumerate(self.columns) if f]
        room = width - 2 * (n - 1) - sum(w for i, w in enumerate(natural) if i not in flex)
        compact: set[int] = set()
        if sum(natural[i] for i in flex) > room:
            compact = set(flex)  # the shorter forms first
            for i in flex:
                natural[i] = max(
                    [len(self.columns[i][0])] + [cell_len(r[i], True) for r in self.rows]
                )
        limits = _share(room, {i: natural[i] for i in flex})
        table = Table(
            title=self.title,
            title_justify="left",
            box=None,
            padding=(0, 1),
            pad_edge=False,
            header_style="bold",
        )
        for i, (name, is_flex) in enumerate(self.columns):
            table.add_column(
                name,
                no_wrap=True,
                overflow="ellipsis" if is_flex else "fold",
                max_width=limits.get(i) if is_flex else None,
            )
        for row in self.rows:
            table.add_row(
                *(
                    (c.compact if i in compact else c.full) if isinstance(c, Cell) else c
                    for i, c in enumerate(row)
                )
            )
        return table


def _share(room: int, wanted: dict[int, int]) -> dict[int, int]:
    """Split `room` columns between flexible columns: the narrow ones get what they
    need, the rest share what is left evenly (at least 4 each)."""
    out: dict[int, int] = {}
    left = dict(wanted)
    while left:
        fair = max(4, room // len(left))
        fits = {i: w for i, w in left.items() if w <= fair}
        if not fits:
            for i in left:
                out[i] = fair
            break
        for i, w in fits.items():
            out[i] = w
            room -= w
            del left[i]
    return out


def counts_cell(values: dict[str, int]) -> Cell:
    """`counts` with `acc 17, rej 2` as its short form."""
    full = counts(values)
    compact = ", ".join(
        f"{_ABBREV.get(part.split(' ')[0], part.split(' ')[0])} {part.split(' ')[1]}"
        for part in full.split(", ")
        if " " in part
    )
    return Cell(full, compact if values and any(values.values()) else full)


def show_runs(out: Console, runs: Sequence[Any], title: str = "runs", short: bool = False) -> None:
    """Runs as a table, one line each."""
    ids = short_ids([r.run_id for r in runs] + [link.run_id for r in runs for link in r.links])

    def rid(run_id: str) -> str:
        return ids.get(run_id, run_id) if short else run_id

    grid = Grid(
        title,
        [
            ("run", False),
            ("state", False),
            ("items", True),
            ("waiting on", False),
            ("links", True),
            ("updated", False),
        ],
        short,
    )
    for run in runs:
        grid.add(
            escape(rid(run.run_id)),
            state(run.state),
            counts_cell(run.counts),
            run.waiting_on,
            Cell(escape(", ".join(f"{link.relation} {rid(link.run_id)}" for link in run.links))),
            when_short(run.updated_at) if short else when(run.updated_at),
        )
    grid.print(out)
    if not runs:
        out.print("no runs")


def show_items(out: Console, items: Sequence[Any], short: bool = False) -> None:
    """A run's items as a table."""
    grid = Grid(
        f"{len(items)} item(s)",
        [
            ("item", False),
            ("state", False),
            ("required", False),
            ("attempts", False),
            ("lease until", False),
            ("reason / last error", True),
        ],
        short,
    )
    stamp = when_short if short else when
    for item in items:
        lease = stamp(item.lease.expires_at) if item.lease else ""
        detail = getattr(item, "reason", None) or item.last_error or ""
        grid.add(
            escape(item.item_id),
            state(item.state),
            "yes" if item.required else "no",
            str(item.attempts),
            lease,
            Cell(escape(detail)),
        )
    grid.print(out)


def show_attempts(out: Console, attempts: Sequence[Any], short: bool = False) -> None:
    """Attempts as a table, in the order the ledger returned them."""
    grid = Grid(
        f"{len(attempts)} attempt(s)",
        [
            ("item", False),
            ("#", False),
            ("worker", True),
            ("started", False),
            ("finished", False),
            ("stage", True),
            ("outcome", False),
            ("error", True),
        ],
        short,
    )
    stamp = when_short if short else when
    for a in attempts:
        grid.add(
            escape(a.item_id),
            str(a.attempt),
            Cell(escape(a.worker_id)),
            stamp(a.started_at),
            stamp(a.finished_at),
            Cell(escape(a.stage or "")),
            state(a.outcome) if a.outcome else "in flight",
            Cell(escape(a.error or "")),
        )
    grid.print(out)


def _subject(t: Any) -> str:
    """What a transition moved besides its run: the item, the run itself, or (in an
    audit, no run's) a webhook."""
    if t.item_id is not None:
        return str(t.item_id)
    if not t.run_id and str(t.command).startswith("webhook_"):
        return f"(webhook {t.evidence.get('webhook_id', '?')})"
    return "(run)"


def show_transitions(
    out: Console,
    transitions: Sequence[Any],
    title: str,
    with_run: bool = False,
    short: bool = False,
) -> None:
    """Transitions (history or audit) as a table."""
    ids = short_ids(t.run_id for t in transitions) if with_run else {}
    columns = [("pos", False), ("at", False)]
    columns += [("run", False)] if with_run else []
    columns += [("item", False), ("from", False), ("to", False), ("actor", True), ("reason", True)]
    grid = Grid(f"{title}: {len(transitions)} transition(s)", columns, short)
    stamp = when_short if short else when
    for t in transitions:
        run = [escape(ids.get(t.run_id, t.run_id) if short else t.run_id)] if with_run else []
        grid.add(
            str(t.position),
            stamp(t.at),
            *run,
            escape(_subject(t)),
            t.from_state,
            state(t.to_state),
            Cell(escape(f"{t.actor_id}:{t.role}")),
            Cell(escape(t.reason or "")),
        )
    grid.print(out)


def show_verify(out: Console, report: VerifyReport) -> None:
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
