"""`bench.py --against REV`: every figure beside the same figure of a saved build.

The code at git revision REV (a saved build: its `ledger/`, `scripts/` and the test
server helper, taken with `git archive`) and the code as it is now (copied, as
`--snapshot` does) each run as a child `bench.py`, one case at a time, in alternating
order (REV first in odd rounds, now first in even ones), on the same PostgreSQL server
(one throwaway server for the whole run, or `--dsn`). Each child writes its rows as
JSON; the table puts each measure's figures side by side with `now / before`, and each
side's own ratio to the baseline it measured in its own child.

A revision whose benchmark lacks a case or a measure leaves its column empty ("-").
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# what a child bench.py needs from a tree (paths missing at an old revision are skipped)
PARTS = (
    "ledger",
    "scripts",
    "tests/__init__.py",
    "tests/support/__init__.py",
    "tests/support/pgserver.py",
)


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True).stdout


def saved_build(repo: Path, rev: str, into: Path) -> str:
    """Extract `PARTS` of `rev` into `into`; the revision's short hash."""
    short = _git(repo, "rev-parse", "--short", rev).decode().strip()
    listed = _git(repo, "ls-tree", "--name-only", rev, "--", *PARTS).decode().split()
    archive = _git(repo, "archive", "--format=tar", rev, "--", *listed)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return short


def working_copy(repo: Path, into: Path) -> None:
    """Copy `PARTS` of the working tree into `into`."""
    for part in PARTS:
        src, dst = repo / part, into / part
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.db*"))
        else:
            shutil.copy2(src, dst)


def run_child(
    tree: Path, case: str, dsn: str | None, passthrough: Sequence[str]
) -> list[dict[str, Any]]:
    """One case of the benchmark in `tree`; its rows (a failed child gives one FAILED row)."""
    out = Path(tempfile.mkstemp(prefix="bench-rows-", suffix=".json")[1])
    try:
        # run from the tree: a case's own `python -c` children put their working
        # directory first on sys.path, and must import this tree's ledger too
        env = dict(os.environ, PYTHONPATH=str(tree))
        env.pop("BENCH_SNAPSHOT_OF", None)
        cmd = [
            sys.executable,
            str(tree / "scripts" / "bench.py"),
            "--cases",
            case,
            "--json",
            str(out),
        ]
        if dsn is not None:
            cmd += ["--dsn", dsn]
        done = subprocess.run(
            [*cmd, *passthrough], env=env, cwd=tree, capture_output=True, text=True, check=False
        )
        try:
            rows: list[dict[str, Any]] = json.loads(out.read_text())["rows"]
            return rows
        except (OSError, ValueError, KeyError):
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return [{"case": case, "name": f"case {case} FAILED", "note": " | ".join(tail)}]
    finally:
        out.unlink(missing_ok=True)


def _num(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:,.3f} {unit}".strip()
    return f"{value:,.0f} {unit}".strip()


def side_by_side(before: list[dict[str, Any]], now: list[dict[str, Any]], rev: str) -> str:
    """The table: each measure of `now` (in its order, then those only `before` has)."""
    old = {(r["case"], r["name"]): r for r in before}
    keys = [(r["case"], r["name"]) for r in now] + [
        k for k in old if k not in {(r["case"], r["name"]) for r in now}
    ]
    new = {(r["case"], r["name"]): r for r in now}
    cols = [
        "case",
        "measure",
        f"before ({rev})",
        "ratio",
        "now",
        "ratio",
        "now/before",
        "goal",
        "met?",
    ]
    body = []
    for key in keys:
        b, n = old.get(key, {}), new.get(key, {})
        bl, nl = b.get("ledger"), n.get("ledger")
        unit = n.get("ledger_unit") or b.get("ledger_unit") or ""
        met = n.get("met")
        body.append(
            [
                key[0],
                key[1],
                _num(bl, unit),
                "-" if b.get("ratio") is None else f"{b['ratio']:.2f}",
                _num(nl, unit),
                "-" if n.get("ratio") is None else f"{n['ratio']:.2f}",
                f"{nl / bl:.2f}"
                if isinstance(nl, int | float) and isinstance(bl, int | float) and bl
                else "-",
                n.get("goal") or "-",
                "n/a" if met is None else ("yes" if met else "NO"),
            ]
        )
    widths = [
        max(len(c), *(len(line[i]) for line in body)) if body else len(c)
        for i, c in enumerate(cols)
    ]
    right = {2, 3, 4, 5, 6}

    def fmt(line: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()

    notes = [f"  {r['case']} {r['name']}: {r['note']}" for r in now if r.get("note")]
    return "\n".join(
        [fmt(cols), "  ".join("-" * w for w in widths), *(fmt(line) for line in body)]
        + (["", "notes (now):", *notes] if notes else [])
    )


def run_against(
    repo: Path,
    rev: str,
    cases: Sequence[str],
    rounds: int,
    dsn: str | None,
    passthrough: Sequence[str],
    say: Callable[[str], None],
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run `cases` with the build at `rev` and with the working tree, alternating; the
    revision's short hash and both sides' rows (a measure seen in several rounds keeps
    its best figure: the higher for a rate, the lower for a cost, by its goal's sign)."""
    root = Path(tempfile.mkdtemp(prefix="bench-against-"))
    try:
        old_tree, new_tree = root / "before", root / "now"
        short = saved_build(repo, rev, old_tree)
        working_copy(repo, new_tree)
        sides: dict[str, dict[tuple[str, str], dict[str, Any]]] = {"before": {}, "now": {}}
        order: dict[str, list[tuple[str, str]]] = {"before": [], "now": []}
        for r in range(rounds):
            for case in cases:
                pair = [("before", old_tree), ("now", new_tree)]
                for side, tree in pair if r % 2 == 0 else pair[::-1]:
                    say(f"round {r + 1}: case {case}, {side}")
                    for row in run_child(tree, case, dsn, passthrough):
                        key = (row["case"], row["name"])
                        if key not in sides[side]:
                            order[side].append(key)
                            sides[side][key] = row
                        else:
                            sides[side][key] = _better(sides[side][key], row)
        return (
            short,
            [sides["before"][k] for k in order["before"]],
            [sides["now"][k] for k in order["now"]],
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _better(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Of two rounds' rows of one measure, the better: a goal written with `<` or `<=`
    is a cost (lower is better), any other a rate."""
    va, vb = a.get("ledger"), b.get("ledger")
    if not isinstance(va, int | float):
        return b
    if not isinstance(vb, int | float):
        return a
    cost = (a.get("goal") or "").lstrip("ratio ").startswith("<")
    return (b if vb < va else a) if cost else (b if vb > va else a)
