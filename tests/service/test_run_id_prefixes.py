"""A run is named by its whole id or by a unique prefix of it (4 or more characters, as
the `ledger` command's tables show ids): a prefix that names no run is `RunNotFound`,
one that names several is refused listing them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger import InvalidInput, Ledger, RunNotFound
from tests.support.cli import cli
from tests.support.runs import SUBMITTER, finished_run, manifest


def test_a_unique_prefix_names_its_run(lg: Ledger) -> None:
    run_id = finished_run(lg, 1)
    assert lg.resolve_run_id(run_id) == run_id
    for n in (4, 8, 20, 35):
        assert lg.resolve_run_id(run_id[:n]) == run_id
    assert lg.resolve_run_id(run_id[:8].upper()) == run_id


def test_no_match_and_bad_prefixes_are_refused(lg: Ledger) -> None:
    run_id = finished_run(lg, 1)
    other = "0123" if not run_id.startswith("0123") else "4567"
    with pytest.raises(RunNotFound, match="no run id starts with"):
        lg.resolve_run_id(other)
    for short in ("abc", ""):
        with pytest.raises(InvalidInput, match="too short"):
            lg.resolve_run_id(short)
    for no_id in ("zzzz", "ab%c", run_id[:8] + "_", "not-a-run"):
        with pytest.raises(RunNotFound):
            lg.resolve_run_id(no_id)


def test_an_ambiguous_prefix_lists_the_runs_it_names() -> None:
    with Ledger.open("memory://") as lg:
        seen: dict[str, str] = {}
        pair: tuple[str, str] | None = None
        for _ in range(3000):  # two of ~300 random ids share their first 4 characters
            run_id = lg.submit(manifest(1), SUBMITTER).run_id
            if run_id[:4] in seen:
                pair = (seen[run_id[:4]], run_id)
                break
            seen[run_id[:4]] = run_id
        assert pair is not None
        with pytest.raises(InvalidInput, match="ambiguous") as refused:
            lg.resolve_run_id(pair[0][:4])
        assert pair[0] in str(refused.value) and pair[1] in str(refused.value)


def test_the_cli_takes_the_short_ids_its_tables_show(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        run_id = finished_run(lg, 1)
    result = cli(dsn, "status", run_id[:8], "--json")
    assert result.exit_code == 0, result.output
    assert f'"run_id": "{run_id}"' in result.output
    assert os.path.exists(tmp_path / "ledger.db")
