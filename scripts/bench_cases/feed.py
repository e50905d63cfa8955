"""Case 10: the change feed on PostgreSQL.

- Follower throughput: a PostgreSQL ledger filled to `feed_events` events; a `Follower`
  with a no-op handler reads every transition (external mode, and in-database mode with
  the checkpoint's transaction), vs reading the same rows of lg_transitions (the view of
  the event log's transition columns, with each event's state) by position
  with plain psycopg in pages of the same size (goal >= 0.5x, transitions/s); the best
  of `ROUNDS` alternating runs of each.
- Payloads: the external follower with `payloads=True` (each item transition's payload
  as of its event) vs the same follower without (goal >= 0.7x, transitions/s).
- Wake-up: `wait_for_events` blocked on a position, another connection commits; the
  median time from the commit returning to the wait returning (goal < 100 ms).
- Lag under load: `feed_writers` writer processes record runs at full speed for
  `feed_load_seconds` while a follower in this process follows; for each batch it
  handles, lag = now - the time of the batch's last transition (goal: max < 1 s).
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from .common import PgTarget, Row, Sizes, child_env, fill_events, ratio_row

GOAL = 0.5
PAGE = 1000
ROUNDS = 3  # follower throughput: best of this many runs of each side
PAYLOADS_GOAL = 0.7  # a follower given payloads keeps this share of its throughput

_WRITER = """
import sys, time
from ledger import Ledger, Actor
from ledger.service.ledger import Outcome
dsn, seconds, tag = sys.argv[1], float(sys.argv[2]), sys.argv[3]
sub, ctl, w = Actor("bench", "submitter"), Actor("bench", "controller"), Actor("w" + tag, "worker")
with Ledger.open(dsn) as lg:
    ends = time.monotonic() + seconds
    n = 0
    while n == 0 or time.monotonic() < ends:
        m = {"source_version": "s", "config_version": "c",
             "items": [{"item_id": f"{tag}-{n}-{k}"} for k in range(20)]}
        run_id = lg.submit(m, sub).run_id
        lg.start(run_id, ctl)
        for lease in lg.claim(run_id, w, limit=20):
            lg.record([Outcome(lease, "accept")])
        lg.complete(run_id, ctl)
        n += 1
print(n)
"""


def _raw_read(dsn: str) -> tuple[float, int]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        n = after = 0
        while True:
            rows = conn.execute(
                "SELECT * FROM lg_transitions WHERE position > %s ORDER BY position LIMIT %s",
                (after, PAGE),
            ).fetchall()
            if not rows:
                break
            n += len(rows)
            after = rows[-1][0]
        return time.perf_counter() - start, n


def _follow(
    lg: Any, name: str, in_database: bool, reads_all: bool = False, payloads: bool = False
) -> tuple[float, int]:
    from ledger import Follower, Transition

    def no_op_db(batch: list[Any], tx: Any) -> None:
        pass

    def no_op(batch: list[Any]) -> None:
        pass

    fields = [f.name for f in dataclasses.fields(Transition)]

    def reader(batch: list[Any]) -> None:  # a demanding handler: every field of every one
        for t in batch:
            for f in fields:
                getattr(t, f)

    handler = reader if reads_all else no_op_db if in_database else no_op
    with Follower(lg, name, handler, batch=PAGE, in_database=in_database, payloads=payloads) as f:
        f.start()  # the name's lock and checkpoint row: once per process, not per batch
        start = time.perf_counter()
        n = f.catch_up()
        return time.perf_counter() - start, n


def _wake_ms(lg: Any, samples: int) -> list[float]:
    from ledger import Actor
    from ledger.reads.feed import head as feed_head

    sub = Actor("bench", "submitter")
    out: list[float] = []
    for _ in range(samples):
        with lg.store.read() as tx:
            head_pos = feed_head(tx)
        committed: list[float] = []

        def commit(committed: list[float] = committed) -> None:
            time.sleep(0.05)
            lg.submit(
                {"source_version": "s", "config_version": "c", "items": [{"item_id": "x"}]}, sub
            )
            committed.append(time.perf_counter())

        t = threading.Thread(target=commit)
        t.start()
        assert lg.wait_for_events(head_pos, 30)
        woke = time.perf_counter()
        t.join()
        out.append(max(0.0, woke - committed[0]) * 1000)
    return out


def _lag_under_load(lg: Any, dsn: str, writers: int, seconds: float) -> tuple[list[float], int]:
    from datetime import UTC, datetime

    from ledger import Follower

    lags: list[float] = []
    handled = [0]

    def handler(batch: list[Any]) -> None:
        lags.append((datetime.now(UTC) - batch[-1].at).total_seconds())
        handled[0] += len(batch)

    follower = Follower(lg, "bench-lag", handler, batch=PAGE)
    follower.catch_up()
    lags.clear()
    handled[0] = 0
    thread = threading.Thread(target=follower.run)
    thread.start()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, dsn, str(seconds), str(k)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(writers)
    ]
    for p in procs:
        _, err = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            follower.stop()
            thread.join(timeout=60)
            raise RuntimeError(f"a writer process failed: {err[-2000:]}")
    deadline = time.monotonic() + 60  # let it finish what the writers wrote last
    while time.monotonic() < deadline and lg.events(after=follower.position, limit=1):
        time.sleep(0.05)
    follower.stop()
    thread.join(timeout=60)
    return lags, handled[0]


def run(pg: PgTarget, sizes: Sizes, say: Any) -> list[Row]:
    from ledger import Ledger

    rows: list[Row] = []
    with pg.database("feed") as dsn, Ledger.open(dsn) as lg:
        say(f"case 10: filling a PostgreSQL ledger to {sizes.feed_events:,} events")
        fill_events(lg, sizes.feed_events, sizes.fill_batch, prefix="feed")
        from ledger.feed.follower import reset

        # ROUNDS alternating rounds (raw read, external, in-database), the best time of
        # each side: the same statistic for the baseline and the ledger, and neither
        # always first after the fill
        raw_times: list[float] = []
        best: dict[bool, float] = {}
        raw_n = 0
        reads_all: float | None = None
        with_payloads: float | None = None
        for k in range(ROUNDS):
            raw_s, raw_n = _raw_read(dsn)
            raw_times.append(raw_s)
            for in_database in (False, True) if k % 2 == 0 else (True, False):
                mode = "in-database" if in_database else "external"
                say(f"case 10: follower throughput ({mode}), round {k + 1} of {ROUNDS}")
                if k:
                    reset(lg, f"bench-{mode}", 0)
                seconds, n = _follow(lg, f"bench-{mode}", in_database)
                assert n == raw_n, (n, raw_n)
                best[in_database] = min(seconds, best.get(in_database, seconds))
            if k:
                reset(lg, "bench-reads-all", 0)
            seconds, _ = _follow(lg, "bench-reads-all", False, reads_all=True)
            reads_all = min(seconds, reads_all or seconds)
            say(f"case 10: follower throughput (external, payloads), round {k + 1} of {ROUNDS}")
            if k:
                reset(lg, "bench-payloads", 0)
            seconds, n = _follow(lg, "bench-payloads", False, payloads=True)
            assert n == raw_n, (n, raw_n)
            with_payloads = min(seconds, with_payloads or seconds)
        raw_times.append(_raw_read(dsn)[0])
        base = raw_n / min(raw_times)
        for in_database in (False, True):
            mode = "in-database" if in_database else "external"
            rows.append(
                ratio_row(
                    "10",
                    f"Follower ({mode}, no-op, batch {PAGE}) transitions/s vs psycopg read",
                    raw_n / best[in_database],
                    base,
                    "tr/s",
                    GOAL,
                    transitions=raw_n,
                    rounds=ROUNDS,
                )
            )
        assert reads_all is not None
        rows.append(
            Row(
                "10",
                "Follower (external, a handler reading every field) transitions/s",
                raw_n / reads_all,
                "tr/s",
                note=(
                    f"{raw_n / reads_all / base:.2f}x the psycopg read, no goal: evidence and "
                    "at are decoded when first read, so this handler pays for them"
                ),
            )
        )
        assert with_payloads is not None
        rows.append(
            ratio_row(
                "10",
                f"Follower (external, no-op, batch {PAGE}) with payloads=True vs without",
                raw_n / with_payloads,
                raw_n / best[False],
                "tr/s",
                PAYLOADS_GOAL,
                note="each item transition's payload as of its event, from the runs' events",
                transitions=raw_n,
                rounds=ROUNDS,
            )
        )
        say("case 10: wait_for_events wake-up")
        wakes = _wake_ms(lg, sizes.feed_wake_samples)
        median = statistics.median(wakes)
        rows.append(
            Row(
                "10",
                "wait_for_events wake-up after a commit (median ms)",
                median,
                "ms",
                goal="< 100 ms",
                met=median < 100,
                note=f"max {max(wakes):.1f} ms over {len(wakes)} commits",
            )
        )
        say(f"case 10: follower lag under {sizes.feed_writers} writer processes")
        lags, handled = _lag_under_load(lg, dsn, sizes.feed_writers, sizes.feed_load_seconds)
        worst = max(lags) if lags else None
        rows.append(
            Row(
                "10",
                f"follower lag, {sizes.feed_writers} writer processes at full speed (max s)",
                worst,
                "s",
                goal="< 1 s",
                met=None if worst is None else worst < 1.0,
                note=(
                    f"{handled:,} transitions in {len(lags)} batches over "
                    f"{sizes.feed_load_seconds:g} s; median lag "
                    f"{statistics.median(lags) if lags else 0:.3f} s"
                ),
            )
        )
    return rows
