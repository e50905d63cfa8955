"""Progress on stderr for the long commands: `ledger work` (items done / total, rate
and ETA while a worker runs), rebuilds, verify, export and import (events).

`ledger work` (`watch_run`):
It watches the run's accepted counts (one status read every `tick` seconds on a
thread of its own), so it shows the run's progress whoever does the work: this
worker, others beside it, or a reconcile. On a terminal a rich progress bar on
stderr; in a pipe or a log one line every `interval` seconds, plus the last one.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, ClassVar

import typer

# Items still to be finished: everything else is done (accepted, rejected, skipped,
# quarantined waits for a person but no worker can move it).
_OPEN = ("pending", "in_progress", "retryable")


def done_total(counts: dict[str, int]) -> tuple[int, int]:
    """(items finished, items in the run) from a status's counts."""
    total = sum(counts.values())
    return total - sum(counts.get(k, 0) for k in _OPEN), total


def duration(seconds: float) -> str:
    """`0.4s`, `42s`, `3m07s`, `1h02m`."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Rate:
    """Rate and ETA since the first report (`first`, `clock` set by the subclass), and
    the one-line form `label done/total unit (pct%), rate unit/s, ETA t`."""

    clock: Callable[[], float]
    first: tuple[float, int] | None

    def rate_eta(self, done: int, total: int) -> tuple[float | None, float | None]:
        """Units per second since the first report, and seconds left at that rate."""
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
        t0, d0 = self.first
        if now <= t0 or done <= d0:
            return None, None
        rate = (done - d0) / (now - t0)
        return rate, max(0, total - done) / rate

    def progress_line(self, label: str, unit: str, rate_format: str, done: int, total: int) -> str:
        rate, eta = self.rate_eta(done, total)
        pct = 100.0 * done / total if total else 100.0
        text = f"{label} {done:,}/{total:,} {unit} ({pct:.0f}%)"
        if rate is not None:
            text += f", {rate:{rate_format}} {unit}/s"
            if done < total and eta is not None:
                text += f", ETA {duration(eta)}"
        return text


class WorkLines(_Rate):
    """The pipe form: `work: 120/1,000 items (12%), 40 items/s, ETA 22s` at most every
    `interval` seconds, and always the last state. The rate counts only the items
    finished since it started (a run half done when the worker starts is not fast)."""

    def __init__(
        self,
        write: Callable[[str], None],
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write
        self.interval = interval
        self.clock = clock
        self.first: tuple[float, int] | None = None
        self.shown_at: float | None = None
        self.shown: tuple[int, int] | None = None

    def line(self, done: int, total: int) -> str:
        return self.progress_line("work:", "items", ",.1f", done, total)

    def __call__(self, done: int, total: int, last: bool = False) -> None:
        now = self.clock()
        due = self.shown_at is None or now - self.shown_at >= self.interval
        if (done, total) != self.shown and (due or last):
            self.shown_at, self.shown = now, (done, total)
            self.write(self.line(done, total))
        elif self.first is None:
            self.rate_eta(done, total)


class WorkBar:
    """The terminal form: a rich bar on stderr (done/total, %, items/s, ETA)."""

    def __init__(self, progress: Any, task: Any, rates: WorkLines) -> None:
        self.progress, self.task, self.rates = progress, task, rates

    def __call__(self, done: int, total: int, last: bool = False) -> None:
        rate, _eta = self.rates.rate_eta(done, total)
        self.progress.update(
            self.task,
            completed=done,
            total=total,
            rate="" if rate is None else f"{rate:,.1f} items/s",
        )


@contextmanager
def watch_run(
    read_counts: Callable[[], dict[str, int]],
    enabled: bool = True,
    tick: float = 1.0,
    interval: float = 5.0,
) -> Iterator[None]:
    """Show the run's progress on stderr while the body runs (a bar on a terminal, a
    line every `interval` seconds otherwise); the final state is shown on exit."""
    if not enabled:
        yield
        return
    with _reporter(interval) as report:
        stop = threading.Event()

        def poll() -> None:
            while True:
                # a progress read that fails shows nothing: the work goes on regardless
                with suppress(Exception):
                    report(*done_total(read_counts()))
                if stop.wait(tick):
                    return

        thread = threading.Thread(target=poll, name="work-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with suppress(Exception):  # as above: the summary line still follows
                report(*done_total(read_counts()), last=True)


@contextmanager
def _reporter(interval: float) -> Iterator[Any]:
    def write(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    lines = WorkLines(write, interval=interval)
    if not sys.stderr.isatty():
        yield lines
        return
    bar = stderr_bar("working", 30)
    with bar:
        task = bar.add_task("work", total=None, rate="")
        yield WorkBar(bar, task, lines)


def stderr_bar(label: str, width: int) -> Any:
    """A rich progress bar on stderr: label, bar, done/total, %, the task's `rate` field
    and the time left. Imported only on a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn(label),
        BarColumn(bar_width=width),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


# -- events: rebuild, verify, export, import ---------------------------------------


class VerifyProgress:
    """`progress(stage, done, total)` for verify: a line on stderr at most every `interval`
    seconds while replaying (events done / total, rate, ETA), and one as each later
    stage starts."""

    STAGES: ClassVar[dict[str, str]] = {
        "compare": "verify: comparing the live projections with the replay",
        "chains": "verify: checking the hash chains",
    }

    def __init__(self, write: Any, interval: float = 5.0, clock: Any = None) -> None:
        self.replay = RebuildProgress(
            write=write, interval=interval, clock=clock, label="verify: replayed"
        )
        self.write = write

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage == "replay":
            self.replay(done, total)
        elif stage in self.STAGES:
            self.write(self.STAGES[stage])


class RebuildProgress(_Rate):
    """`progress(done, total)` for a rebuild: events done / total, rate and ETA.

    On a terminal a rich progress bar; otherwise (a log, a pipe) one line at most every
    `interval` seconds plus the last one, so captured output stays short and readable.
    The rate counts only events replayed by this process (a resumed rebuild starts
    with the crashed one's events already done).
    """

    def __init__(
        self,
        write: Any = None,
        interval: float = 2.0,
        clock: Any = None,
        bar: Any = None,
        label: str = "rebuilding projections:",
    ) -> None:
        import time

        self.write = write
        self.label = label
        self.interval = interval
        self.clock = clock or time.monotonic
        self.bar = bar  # (rich Progress, task id) on a terminal
        self.first: tuple[float, int] | None = None
        self.shown_at: float | None = None
        self.shown_done = -1

    @classmethod
    @contextmanager
    def on_stderr(cls) -> Iterator[RebuildProgress]:
        if not sys.stderr.isatty():
            yield cls(write=lambda line: typer.echo(line, err=True))
            return
        # fits 80 columns at 1,000,000 events: "rebuilding ━━━━ 500000/1000002 50% 27,862 events/s 0:00:18"
        bar = stderr_bar("rebuilding", 20)
        with bar:
            task = bar.add_task("rebuild", total=None, rate="")
            yield cls(bar=(bar, task))

    def line(self, done: int, total: int) -> str:
        return self.progress_line(self.label, "events", ",.0f", done, total)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            bar, task = self.bar
            rate, _eta = self.rate_eta(done, total)
            bar.update(
                task,
                completed=done,
                total=total,
                rate="" if rate is None else f"{rate:,.0f} events/s",
            )
            return
        now = self.clock()
        last = done >= total
        if done == self.shown_done:
            return
        if last or self.shown_at is None or now - self.shown_at >= self.interval:
            self.shown_at, self.shown_done = now, done
            self.write(self.line(done, total))
