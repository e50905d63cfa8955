"""`ledger items|attempts|history [--limit N] [--after CURSOR]`: without
--limit every page is read and printed (the same JSON as one list); with it one page,
the next cursor on stderr; bad cursors and limits are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledger import Ledger
from ledger.reads import paging
from tests.support.cli import cli, dsn, lg, ok  # noqa: F401  (fixtures)
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest


@pytest.fixture
def busy(lg: Ledger, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    """A run of 11 items with 8 attempts, read by the CLI in pages of 3."""
    monkeypatch.setattr(paging, "PAGE", 3)
    run = lg.submit(manifest(11), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    for k, lease in enumerate(lg.claim(run, WORKER, limit=8)):
        if k % 3:
            lg.accept(lease)
        else:
            lg.fail_attempt(lease, "boom")
    return run


def expected(lg: Ledger, run: str) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    return {
        "items": [v.to_dict() for v in lg.items(run, limit=10_000)],
        "attempts": [v.to_dict() for v in lg.attempts(run, limit=10_000)],
        "history": [v.to_dict() for v in lg.history(run, limit=10_000)],
    }


def test_every_page_by_default(dsn: str, lg: Ledger, busy: str) -> None:  # noqa: F811
    want = expected(lg, busy)
    assert len(want["items"]) == 11 and len(want["attempts"]) == 8
    for cmd, values in want.items():
        out = ok(dsn, cmd, busy, "--json").stdout
        assert out == json.dumps(values, indent=2, ensure_ascii=False) + "\n"
        lines = ok(dsn, cmd, busy, "--jsonl").stdout.splitlines()
        assert [json.loads(line) for line in lines] == values
        table = ok(dsn, cmd, busy, "--wide").stdout
        assert table.strip()


def test_limit_and_after(dsn: str, lg: Ledger, busy: str) -> None:  # noqa: F811
    want = expected(lg, busy)
    keys = {
        "items": lambda v: v["item_id"],
        "attempts": lambda v: f"{v['item_id']}:{v['attempt']}",
        "history": lambda v: str(v["position"]),
    }
    for cmd, values in want.items():
        seen: list[dict[str, Any]] = []
        after: list[str] = []
        while True:
            r = ok(dsn, cmd, busy, "--limit", "4", *after, "--json")
            page = json.loads(r.stdout)
            seen += page
            if "next page: --after " not in r.stderr:
                assert len(page) < 4
                break
            cursor = r.stderr.split("next page: --after ", 1)[1].split()[0]
            assert cursor == keys[cmd](page[-1])
            after = ["--after", cursor]
        assert seen == values, cmd
        last = keys[cmd](values[-1])
        assert json.loads(ok(dsn, cmd, busy, "--after", last, "--json").stdout) == []


@pytest.mark.parametrize(
    "args",
    [
        ["items", "--limit", "0"],
        ["items", "--limit", "10001"],
        ["items", "--after", "nope"],
        ["attempts", "--after", "i0"],
        ["attempts", "--after", "i0:77"],
        ["history", "--after", "-1"],
        ["history", "--after", "x"],
        ["history", "--json", "--jsonl"],
    ],
)
def test_bad_paging(dsn: str, lg: Ledger, busy: str, args: list[str]) -> None:  # noqa: F811
    r = cli(dsn, args[0], busy, *args[1:])
    assert r.exit_code != 0
    assert r.exit_code in (1, 2), (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
