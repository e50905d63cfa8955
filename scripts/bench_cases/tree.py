"""Case 12: the stored Merkle tree (ledger/stores/tree.py).

(a) The cost per append of keeping the tree: case 1's work in one process (claim(B) +
record(B accepts) until a run is drained), then `extend` over the events that work
appended, in ROUNDS rounds on fresh runs. Share = seconds extending / seconds of the
work; goal < 5% (the work is the same whether or not the tree is kept: the tree is
extended by its readers, after the appends, so this is all it costs). PostgreSQL when a
server is given, and SQLite.

(b) A root and proofs at `tree_leaves` leaves (1,000,000) on PostgreSQL: leaves bulk-loaded
(`tree.load`, a page of leaves and one of nodes per statement; no events needed), then the median time of
`root`, an inclusion proof and a consistency proof at random sizes (goal < 1 s each),
against the baseline of computing the root from scratch by reading every leaf (what
the ledger did before it kept the tree).
"""

from __future__ import annotations

import hashlib
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import Callback, Clock, PgTarget, Row, Sizes, accept_all, running_run

ROUNDS = 4
SAMPLES = 21


def _append_cost(dsn: str, n: int, batch: int) -> tuple[float, float, int]:
    """(seconds of work, seconds extending, events) over ROUNDS rounds."""
    from ledger import Actor, Ledger
    from ledger.stores import tree as T

    work = extending = 0.0
    with Ledger.open(dsn) as lg:
        with lg.store.write() as tx:
            before = T.extend(tx)
        start = before
        per_round = max(batch, n // ROUNDS)
        for _ in range(ROUNDS):
            run_id = running_run(lg, per_round)
            with Clock() as c:
                accept_all(lg, run_id, Actor("bench-w", "worker"), batch)
            work += c.seconds
            with Clock() as c, lg.store.write() as tx:
                size = T.extend(tx)
            extending += c.seconds
    return work, extending, size - start


def _median_ms(fn: Any) -> float:
    times = []
    for _ in range(SAMPLES):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _big_tree(dsn: str, leaves: int, say: Callback) -> list[Row]:
    from ledger import Ledger
    from ledger.core import merkle as M
    from ledger.stores import tree as T

    rng = random.Random(12)
    with Ledger.open(dsn) as lg:
        with Clock() as load, lg.store.write() as tx:
            T.load(
                tx,
                ((p, hashlib.sha256(p.to_bytes(8, "big")).digest()) for p in range(1, leaves + 1)),
            )
        say(f"  {leaves:,} leaves loaded in {load.seconds:.1f}s")
        with lg.store.read() as tx:
            root_ms = _median_ms(lambda: T.root(tx, rng.randint(leaves // 2, leaves)))
            inc_ms = _median_ms(
                lambda: T.inclusion(
                    tx, rng.randrange(leaves // 2), rng.randint(leaves // 2, leaves)
                )
            )
            con_ms = _median_ms(
                lambda: T.consistency(
                    tx, rng.randint(1, leaves // 2), rng.randint(leaves // 2, leaves)
                )
            )
            size = T.size(tx)
            with Clock() as scratch:
                f = M.Frontier()
                start = 0
                while start < size:
                    rows = tx.fetchall(
                        "SELECT data FROM lg_merkle_leaves WHERE leaf_index >= %s AND leaf_index < %s ORDER BY leaf_index",
                        (start, start + 50_000),
                    )
                    for r in rows:
                        f.append(M.leaf_hash(bytes(r["data"])))
                    start += 50_000
            assert f.root() == T.root(tx, size)
    base_ms = scratch.seconds * 1000
    say(
        f"  root {root_ms:.1f} ms, inclusion {inc_ms:.1f} ms, consistency {con_ms:.1f} ms; "
        f"from scratch {base_ms:,.0f} ms"
    )
    rows = []
    for what, ms in (("root", root_ms), ("inclusion proof", inc_ms), ("consistency proof", con_ms)):
        rows.append(
            Row(
                "12",
                f"PG {what} at {leaves:,} leaves (median of {SAMPLES})",
                ms,
                "ms",
                base_ms,
                "ms",
                ms / base_ms,
                "< 1000 ms",
                ms < 1000,
                note="baseline: the root from scratch, every leaf read and hashed",
            )
        )
    return rows


def run(pg: PgTarget | None, sizes: Sizes, say: Callback, tmp: Path | None = None) -> list[Row]:
    n, batch = sizes.sqlite_items, sizes.throughput_ledger_batch
    rows: list[Row] = []

    def cost(name: str, dsn: str) -> None:
        say(f"case 12: {name}, {n} items, claim({batch})+record, then extend the tree")
        work, extending, events = _append_cost(dsn, n, batch)
        share = extending / work
        say(f"  {events:,} events: work {work:.2f}s, extending {extending:.3f}s ({share:.1%})")
        rows.append(
            Row(
                "12",
                f"{name} keeping the Merkle tree, per append (share of case 1's work)",
                extending / events * 1e6,
                "us/event",
                work / events * 1e6,
                "us/event",
                share,
                "ratio < 0.05",
                share < 0.05,
                note=f"{events:,} events in {ROUNDS} rounds; extend after each round",
            )
        )

    if pg is not None:
        with pg.database("c12") as dsn:
            cost("PG", dsn)
        with pg.database("c12big") as dsn:
            say(f"case 12: PG, a tree of {sizes.tree_leaves:,} leaves")
            rows += _big_tree(dsn, sizes.tree_leaves, say)
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c12-") as d:
        cost("SQLite", f"sqlite:///{d}/ledger.db")
    return rows
