"""Stored means readable (rule 17 of the rule book): a ledger holding every kind of event
the ledger writes, with awkward text in it, is read back through every read path (the
Python API, the CLI's --json and --jsonl, HTTP) and each answer is strict JSON. And
`verify` reports a stored event whose payload is not strict JSON (one a database may hold
from a run-ledger that did not check its input)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from ledger import Actor, Ledger
from ledger.cli.entry import app as cli_app
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.validation import strict_loads
from ledger.http import create_app
from ledger.http.tokens import add_token
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest

ODD = 'caf\u00e9 \U0001f9fe \u202e "q" \\ password=hunter2 \n tab\t'


def _strict(text: str | bytes, where: str) -> Any:
    value = strict_loads(text, where, max_bytes=10**9)
    json.dumps(value, allow_nan=False)
    return value


def _populate(lg: Ledger, clock: ManualClock) -> list[str]:
    """Runs that between them hold every run and item command the ledger records."""
    m = manifest(
        6, max_attempts=2, lease_seconds=30, partial_delivery=True, review={"decision": "ok"}
    )
    m["items"][0]["payload"] = {"text": ODD, "n": [1.5, -0.0, 10**30]}
    main = lg.submit(m, SUBMITTER).run_id
    lg.start(main, CONTROLLER)
    leases = lg.claim(main, WORKER, limit=6)
    lg.heartbeat(leases[0])
    lg.accept(leases[0], evidence={"receipt": ODD, "api_key": "sk-abcdefghijklmnop"}, stage="s1")
    lg.reject(leases[1], "bad-row", detail=ODD)
    lg.fail_attempt(leases[2], "OSError: /data/f\udcff.bin " + ODD)  # retryable
    lg.fail_attempt(leases[3], "boom", retryable=False)  # quarantined
    lg.release(main, "i3", OPERATOR, ODD)
    lg.fail_attempt(leases[4], "boom", retryable=False)
    lg.reject_item(main, "i4", REVIEWER, "rule-x", detail=ODD)
    clock.advance(60)
    lg.reconcile()  # i5's lease expired
    lg.skip(main, "i5", OPERATOR, ODD)
    lg.amend(
        main, SUBMITTER, "late", items=[{"item_id": "n1", "payload": {"x": ODD}}], withdraw=["i2"]
    )
    (n1,) = lg.claim(main, WORKER)
    lg.accept(n1)
    for lease in lg.claim(main, WORKER, limit=5):
        lg.accept(lease)
    lg.request_review(main, CONTROLLER, "ok")
    version = lg.status(main).input_version
    lg.decide(main, Actor("rita", "reviewer"), version, True, ODD)
    lg.pause(main, OPERATOR, ODD)
    lg.resume(main, OPERATOR, reason="back to work")
    lg.complete(main, CONTROLLER)

    failing = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(failing, CONTROLLER)
    lg.claim(failing, WORKER)
    lg.fail(failing, CONTROLLER, ODD, transient=True)
    retried = lg.retry(failing, OPERATOR, ODD).run_id
    lg.start(retried, CONTROLLER)
    lg.claim(retried, WORKER)
    lg.cancel(retried, OPERATOR, ODD)  # canceling: one live lease, the rest skipped
    clock.advance(120)
    lg.reconcile()
    lg.repair(main, OPERATOR, reason=ODD) if lg.status(main).state != S.SUCCEEDED else None
    lg.compensate(main, OPERATOR, ODD)

    late = lg.submit(manifest(1, lease_seconds=600, run_deadline_seconds=10), SUBMITTER).run_id
    lg.start(late, CONTROLLER)
    clock.advance(30)
    lg.reconcile()  # past the run deadline
    return [run.run_id for run in lg.runs(limit=1000)]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Ledger, str, list[str], Path]]:
    clock = ManualClock()
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    lg = Ledger.open(dsn, clock=clock)
    try:
        runs = _populate(lg, clock)
        yield lg, dsn, runs, tmp_path
    finally:
        lg.close()


def test_every_event_kind_reads_back_as_strict_json_on_every_path(
    world: tuple[Ledger, str, list[str], Path],
) -> None:
    lg, dsn, runs, tmp_path = world
    commands = {t.command for t in lg.audit(limit=100_000)}
    expected = {
        "submit", "start", "claim", "accept", "reject", "fail_attempt", "release",
        "reject_item", "expire", "skip", "amend", "withdraw", "request_review", "decide",
        "pause", "resume", "complete", "fail", "retry", "cancel", "cancel_skip",
        "compensate", "reconcile_deadline",
    }  # fmt: skip
    assert expected <= commands, expected - commands

    # Python
    for run_id in runs:
        docs: list[Any] = [lg.status(run_id).to_dict()]
        docs += [x.to_dict() for x in lg.items(run_id)]
        docs += [x.to_dict() for x in lg.attempts(run_id)]
        docs += [x.to_dict() for x in lg.history(run_id)]
        docs += [x.to_dict() for x in lg.lineage(run_id)]
        for doc in docs:
            _strict(json.dumps(doc, allow_nan=False, ensure_ascii=False), "python")
    # CLI
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(cli_app, [f"--dsn={dsn}", *args])
        assert result.exit_code == 0, (args, result.output[-500:])
        return result.stdout

    _strict(cli("runs", "--json"), "cli runs")
    _strict(cli("audit", "--json"), "cli audit")
    for line in cli("audit", "--jsonl").splitlines():
        _strict(line, "cli audit --jsonl")
    for line in cli("events", "--jsonl").splitlines():
        _strict(line, "cli events --jsonl")
    for run_id in runs:
        for command in ("status", "items", "attempts", "history", "lineage"):
            _strict(cli(command, run_id, "--json"), f"cli {command}")
    # HTTP
    tokens = tmp_path / "tokens"
    token = add_token("olga", "operator", tokens)
    with TestClient(create_app(lg, tokens_path=tokens)) as client:
        headers = {"Authorization": f"Bearer {token}"}
        paths = ["/runs?limit=1000", "/audit?limit=1000", "/overview", "/board"]
        for run_id in runs:
            paths += [
                f"/runs/{run_id}{tail}"
                for tail in ("", "/items", "/attempts", "/history", "/lineage")
            ]
        for path in paths:
            r = client.get(path, headers=headers)
            assert r.status_code == 200, (path, r.text[:300])
            _strict(r.content, f"GET {path}")
    assert lg.verify().ok


def test_verify_reports_a_stored_event_that_is_not_strict_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = Ledger.open(f"sqlite:///{tmp_path}/old.db", clock=ManualClock())
    try:
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        lease, _ = lg.claim(run_id, WORKER, limit=2)
        # as the code before the boundary did: evidence passed through unchecked
        monkeypatch.setattr(A, "evidence", lambda value: value or {})
        lg.accept(lease, evidence={"score": math.nan})
        monkeypatch.undo()
        report = lg.verify()
        bad = [p for p in report.problems if p["kind"] == "not_strict_json"]
        assert len(bad) == 1, report.problems
        assert bad[0]["run_id"] == run_id and "NaN" in bad[0]["detail"]
        assert not report.ok
    finally:
        lg.close()
