"""In a pipe, the `ledger` command's tables are plain: no borders or colours, every id
whole, columns aligned with spaces and no trailing blanks, a header line first, so
`ledger runs | awk '{print $1}'` gives the run ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ledger import Ledger
from tests.support.runs import finished_run


def _ledger(dsn: str, *args: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ledger.cli import main; raise SystemExit(main())",
            "--dsn",
            dsn,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_piped_tables_are_plain(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        runs = [finished_run(lg, 2) for _ in range(3)]
    for args in (["runs"], ["items", runs[0]], ["history", runs[0]], ["attempts", runs[0]]):
        text = _ledger(dsn, *args)
        lines = text.splitlines()
        assert len(lines) >= 2, (args, text)
        assert not any(ch in text for ch in "┃━│─┏┓┗┛╇╈┡┩"), (args, text)
        assert "\x1b[" not in text
        assert all(line == line.rstrip() for line in lines)
        assert lines[0].split()[0].isupper()
    ids = [line.split()[0] for line in _ledger(dsn, "runs").splitlines()[1:]]
    assert sorted(ids) == sorted(runs)


def test_every_read_takes_json(tmp_path: Path) -> None:
    import json

    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        run_id = finished_run(lg, 2)
        events = lg.events()
    overview = json.loads(_ledger(dsn, "top", "--json"))
    assert overview["open_runs"] == 0 if "open_runs" in overview else isinstance(overview, dict)
    listed = json.loads(_ledger(dsn, "events", "--json"))
    assert [e["position"] for e in listed] == [e.position for e in events]
    mine = json.loads(_ledger(dsn, "events", "--json", "--run", run_id, "--after", "0"))
    assert {e["run_id"] for e in mine} == {run_id}


def test_submit_example_prints_a_manifest_that_submits(tmp_path: Path) -> None:
    import json

    from ledger.cli.runs import EXAMPLE_MANIFEST

    dsn = f"sqlite:///{tmp_path}/ledger.db"
    text = _ledger(dsn, "submit", "--example")
    assert json.loads(text) == EXAMPLE_MANIFEST
    repo = Path(__file__).resolve().parents[2]
    assert json.loads((repo / "examples" / "manifest.json").read_text()) == EXAMPLE_MANIFEST
    (tmp_path / "m.json").write_text(text)
    status = json.loads(_ledger(dsn, "submit", str(tmp_path / "m.json"), "--json"))
    assert status["state"] == "queued"
    assert status["counts"]["pending"] == len(EXAMPLE_MANIFEST["items"])
