"""The `ledger` command through its real entry point (typer's CliRunner, and a subprocess)."""

# ruff: noqa: F811  (the fixtures of tests/support/cli.py are imported, then requested by name)
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from ledger import Ledger
from ledger.cli.entry import app
from tests.support.cli import (  # noqa: F401  (fixtures)
    cli,
    doc,
    dsn,
    lg,
    ok,
    runner,
    submitted,
    write_json,
)
from tests.support.runs import CONTROLLER, WORKER, manifest


def snapshot(dsn: str) -> tuple[Any, ...]:
    """Everything a refused command must leave unchanged."""
    with Ledger.open(dsn) as lg:
        runs = [(r.run_id, r.state, r.revision, r.input_version) for r in lg.runs(limit=10_000)]
        transitions = len(list(lg.audit()))
        items = [(i.item_id, i.state, i.revision) for r in runs for i in lg.items(r[0])]
    return runs, transitions, items


def assert_refused(result: Result, error_type: str, *words: str) -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {error_type}: "), lines[0]
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert result.stdout == ""


# -- the happy path, through every read -----------------------------------------------


HANDLER = """
from ledger import Accepted, Rejected

def handle(lease):
    if lease.payload["n"] == 2:
        return Rejected("n_is_two", detail="two is not allowed")
    return Accepted(evidence={"n": lease.payload["n"]}, stage="done")
"""


def test_submit_start_work_complete_and_every_read(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "cli_test_handlers.py").write_text(HANDLER)
    run = submitted(dsn, tmp_path, n=3, partial_delivery=True, tolerated_failures=1)
    assert doc(dsn, "status", run)["state"] == "queued"
    assert doc(dsn, "start", run)["state"] == "running"

    summary = doc(dsn, "work", run, "--handler", "cli_test_handlers:handle", "--workers", "2")
    assert (summary["claimed"], summary["accepted"], summary["rejected"]) == (3, 2, 1)
    assert summary["stopped"] == "nothing left to claim"

    status = doc(dsn, "complete", run)
    assert status["state"] == "completed_with_errors"
    assert status["counts"]["accepted"] == 2 and status["counts"]["rejected"] == 1
    assert [na["item_id"] for na in status["not_accepted"]] == ["i2"]
    assert doc(dsn, "status", run) == status

    assert [r["run_id"] for r in doc(dsn, "runs")] == [run]
    assert doc(dsn, "runs", "--state", "queued") == []
    items = doc(dsn, "items", run)
    assert {i["item_id"]: i["state"] for i in items} == {
        "i0": "accepted",
        "i1": "accepted",
        "i2": "rejected",
    }
    assert [i["item_id"] for i in doc(dsn, "items", run, "--state", "rejected")] == ["i2"]
    attempts = doc(dsn, "attempts", run)
    assert sorted((a["item_id"], a["outcome"]) for a in attempts) == [
        ("i0", "accepted"),
        ("i1", "accepted"),
        ("i2", "rejected"),
    ]
    assert len(doc(dsn, "attempts", run, "--item", "i0")) == 1

    history = doc(dsn, "history", run)
    assert (history[0]["from_state"], history[0]["to_state"]) == ("-", "queued")
    assert history[-1]["to_state"] == "completed_with_errors"
    assert doc(dsn, "audit", "--run", run) == history
    lines = ok(dsn, "audit", "--run", run, "--jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines] == history
    workers = doc(dsn, "audit", "--role", "worker")
    assert workers and all(t["role"] == "worker" for t in workers)
    assert doc(dsn, "audit", "--since", "2999-01-01T00:00:00Z") == []
    assert [r["run_id"] for r in doc(dsn, "lineage", run)] == [run]


def test_human_tables(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    out = ok(dsn, "status", run).stdout
    assert run in out and "queued" in out and "waiting on" in out and "controller" in out
    assert run in ok(dsn, "runs").stdout
    assert "i0" in ok(dsn, "items", run).stdout
    assert "queued" in ok(dsn, "history", run).stdout
    assert "submitter" in ok(dsn, "audit").stdout
    assert f"started run {run}: running" in ok(dsn, "start", run).stdout


def test_global_options_before_or_after_the_subcommand(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    after = runner.invoke(app, ["status", run, "--json", "--dsn", dsn])
    assert after.exit_code == 0, after.stderr
    assert json.loads(after.stdout)["run_id"] == run
    started = runner.invoke(app, ["start", run, f"--dsn={dsn}", "--as", "carol"])
    assert started.exit_code == 0, started.stderr
    last = doc(dsn, "history", run)[-1]
    assert (last["actor_id"], last["role"], last["to_state"]) == ("carol", "controller", "running")


def test_ledger_dsn_environment_variable(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    result = runner.invoke(app, ["status", run, "--json"], env={"LEDGER_DSN": dsn})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["run_id"] == run


def test_default_roles_and_as(dsn: str, tmp_path: Path) -> None:
    path = write_json(tmp_path / "m.json", manifest(1))
    run = json.loads(ok(dsn, "--as", "sam:submitter", "submit", path, "--json").stdout)
    assert run["created_by"] == "sam"
    before = snapshot(dsn)
    refused = cli(dsn, "--as", "bob:worker", "start", run["run_id"])
    assert_refused(refused, "NotAuthorized", "worker", "controller")
    assert snapshot(dsn) == before
    ok(dsn, "--as", "ops:operator", "cancel", run["run_id"], "--reason", "not needed")
    assert doc(dsn, "status", run["run_id"])["state"] == "canceled"


# -- bad input: one line on stderr, exit 1, nothing written --------------------------


@pytest.mark.parametrize(
    ("content", "error_type", "words"),
    [
        ("{not json", "ManifestInvalid", ("not valid JSON", "line 1")),
        ("[1, 2]", "ManifestInvalid", ("JSON object",)),
        (json.dumps(manifest(1, max_attempts=0)), "ManifestInvalid", ("policy.max_attempts",)),
        (json.dumps({**manifest(1), "itemz": []}), "ManifestInvalid", ("itemz",)),
        (json.dumps({**manifest(1), "items": []}), "ManifestInvalid", ("items",)),
        (
            json.dumps(manifest(1, tolerated_failures=2)),
            "ManifestInvalid",
            ("tolerated_failures", "partial_delivery"),
        ),
    ],
    ids=[
        "invalid-json",
        "not-an-object",
        "bad-max-attempts",
        "unknown-key",
        "no-items",
        "tolerated-without-partial",
    ],
)
def test_bad_manifests_are_refused_and_nothing_is_written(
    dsn: str, tmp_path: Path, content: str | None, error_type: str, words: tuple[str, ...]
) -> None:
    submitted(dsn, tmp_path)  # something to stay unchanged
    path = tmp_path / "missing.json"
    if content is not None:
        path.write_text(content)
    before = snapshot(dsn)
    assert_refused(cli(dsn, "submit", str(path)), error_type, *words)
    assert snapshot(dsn) == before


def test_a_missing_manifest_file_is_bad_usage_and_nothing_is_written(
    dsn: str, tmp_path: Path
) -> None:
    submitted(dsn, tmp_path)
    before = snapshot(dsn)
    result = cli(dsn, "submit", str(tmp_path / "missing.json"))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "missing.json" in result.stderr and "does not exist" in result.stderr
    assert snapshot(dsn) == before


def test_unknown_runs_illegal_transitions_and_stale_reviews_write_nothing(
    dsn: str, tmp_path: Path
) -> None:
    run = submitted(dsn, tmp_path, n=1, review={"decision": "signoff"})
    unknown = str(uuid.uuid4())
    before = snapshot(dsn)
    assert_refused(cli(dsn, "status", unknown), "RunNotFound", unknown)
    assert_refused(cli(dsn, "items", "not-a-run"), "RunNotFound", "not-a-run")
    assert_refused(cli(dsn, "cancel", unknown, "--reason", "x"), "RunNotFound", unknown)
    assert_refused(cli(dsn, "complete", run), "IllegalTransition", "queued", "running")
    assert_refused(cli(dsn, "resume", run, "--reason", "x"), "IllegalTransition", "queued")
    assert_refused(cli(dsn, "skip", run, "nope", "--reason", "x"), "ItemNotFound", "nope")
    assert_refused(
        cli(dsn, "fail", run, "--reason", "x", "--failure-reason", "bored"), "InvalidInput", "bored"
    )
    unknown_state = cli(dsn, "runs", "--state", "sleeping")  # bad usage, not a ledger error
    assert unknown_state.exit_code == 2 and "sleeping" in unknown_state.stderr
    assert snapshot(dsn) == before

    ok(dsn, "start", run)
    version = doc(dsn, "request-review", run, "--decision", "signoff")["input_version"]
    part = write_json(tmp_path / "part.json", {"items": [{"item_id": "late"}]})
    ok(dsn, "--as", "sam:submitter", "amend", run, part, "--reason", "late item")
    before = snapshot(dsn)
    assert_refused(
        cli(
            dsn,
            "--as",
            "rita:reviewer",  # not the submitter: four eyes (rule 13 of the rule book)
            "review",
            run,
            "--approve",
            "--input-version",
            version,
            "--reason",
            "ok",
        ),
        "StaleReview",
        version,
    )
    bad_part = write_json(tmp_path / "bad.json", {"itemz": []})
    assert_refused(cli(dsn, "amend", run, bad_part, "--reason", "x"), "ManifestInvalid", "itemz")
    assert_refused(
        cli(dsn, "work", run, "--handler", "nothing_here"), "InvalidInput", "module:function"
    )
    assert snapshot(dsn) == before

    current = doc(dsn, "status", run)["input_version"]
    assert current != version
    approved = doc(
        dsn,
        "--as",
        "rita:reviewer",
        "review",
        run,
        "--approve",
        "--input-version",
        current,
        "--reason",
        "ok",
    )
    assert approved["state"] == "running"


def test_terminal_runs_refuse_and_cancel_reports_completion_won(
    dsn: str, lg: Ledger, tmp_path: Path
) -> None:
    run = submitted(dsn, tmp_path, n=1)
    lg.start(run, CONTROLLER)
    (lease,) = lg.claim(run, WORKER)
    lg.accept(lease)
    assert doc(dsn, "complete", run)["state"] == "succeeded"
    before = snapshot(dsn)
    assert_refused(cli(dsn, "cancel", run, "--reason", "x"), "AlreadyTerminal", "completion won")
    assert_refused(cli(dsn, "start", run), "AlreadyTerminal", "succeeded")
    assert snapshot(dsn) == before


def test_an_unreachable_store_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    where = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    assert_refused(runner.invoke(app, ["--dsn", where, "runs"]), "StoreUnavailable", "not exist")
    m = write_json(tmp_path / "m.json", manifest(1))
    result = runner.invoke(app, ["--dsn", where, "submit", m])
    assert_refused(result, "StoreUnavailable", "unable to open")  # typed, as any store fault
    assert_refused(runner.invoke(app, ["--dsn", "mysql://x", "runs"]), "InvalidInput", "mysql")


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["status"],
        ["review", "RUN", "--input-version", "v", "--reason", "r"],
        ["status", "RUN", "--at", "yesterday-ish"],
        ["work", "RUN", "--handler", "m:f", "--workers", "0"],
        ["audit", "--json", "--jsonl"],
        ["--as"],
    ],
    ids=[
        "unknown-command",
        "missing-run",
        "missing-decision",
        "bad-time",
        "zero-workers",
        "json-and-jsonl",
        "as-without-value",
    ],
)
def test_usage_errors_exit_2(dsn: str, args: list[str]) -> None:
    result = cli(dsn, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


# -- the other commands ------------------------------------------------------------


def test_pause_resume_cancel(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    ok(dsn, "start", run)
    assert doc(dsn, "pause", run, "--reason", "maintenance")["state"] == "paused"
    assert doc(dsn, "status", run)["waiting_on"] == "operator"
    assert doc(dsn, "resume", run, "--reason", "done")["state"] == "running"
    first = doc(dsn, "cancel", run, "--reason", "not needed")
    assert first == {"run_id": run, "state": "canceled", "in_flight": 0, "already": False}
    assert doc(dsn, "cancel", run, "--reason", "again")["already"] is True
    assert "already recorded" in ok(dsn, "cancel", run, "--reason", "again").stdout
    counts = doc(dsn, "status", run)["counts"]
    assert counts["skipped"] == 2 and not counts.get("pending")


def test_item_commands_on_quarantined_items(dsn: str, lg: Ledger, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path, n=3)
    lg.start(run, CONTROLLER)
    for lease in lg.claim(run, WORKER, limit=3):
        lg.fail_attempt(lease, "broken", retryable=False)
    assert doc(dsn, "release", run, "i0", "--reason", "fixed upstream")["state"] == "retryable"
    assert doc(dsn, "skip", run, "i1", "--reason", "not needed")["state"] == "skipped"
    rejected = doc(
        dsn, "reject-item", run, "i2", "--reason", "totals differ", "--rule", "totals_match"
    )
    assert rejected["state"] == "rejected"
    history = doc(dsn, "history", run)
    roles = {(t["item_id"], t["to_state"]): t["role"] for t in history}
    assert roles[("i0", "retryable")] == "operator"
    assert roles[("i1", "skipped")] == "operator"
    assert roles[("i2", "rejected")] == "reviewer"
    assert "skipped" in ok(dsn, "skip", run, "i0", "--reason", "enough").stdout


def test_fail_retry_repair_compensate_make_linked_runs(
    dsn: str, lg: Ledger, tmp_path: Path
) -> None:
    run = submitted(dsn, tmp_path, n=2)
    lg.start(run, CONTROLLER)
    (lease, _) = lg.claim(run, WORKER, limit=2)
    lg.accept(lease)
    failed = doc(
        dsn,
        "fail",
        run,
        "--reason",
        "source export vanished",
        "--failure-reason",
        "input_unavailable",
    )
    assert (failed["state"], failed["failure_kind"]) == ("failed", "transient")

    retried = doc(dsn, "retry", run)
    assert retried["links"] == [{"relation": "retry_of", "run_id": run}]
    repaired = doc(dsn, "repair", run, "--items", "i1")
    assert repaired["links"] == [{"relation": "repair_of", "run_id": run}]
    assert repaired["counts"]["pending"] == 1
    # under a corrected configuration: a correction_of, the original's config unchanged
    before = snapshot(dsn)
    assert_refused(cli(dsn, "repair", run, "--policy", "[1]"), "ManifestInvalid", "policy")
    assert_refused(cli(dsn, "repair", run, "--policy", "{nope"), "ManifestInvalid", "policy")
    assert snapshot(dsn) == before
    corrected = doc(
        dsn, "repair", run, "--config-version", "cfg-fixed", "--policy", '{"max_attempts": 4}'
    )
    assert corrected["links"] == [{"relation": "correction_of", "run_id": run}]
    assert (corrected["config_version"], corrected["policy"]["max_attempts"]) == ("cfg-fixed", 4)
    assert doc(dsn, "status", run)["config_version"] != "cfg-fixed"
    undo = doc(dsn, "compensate", run, "--reason", "refund the delivered item")
    assert undo["links"] == [{"relation": "compensates", "run_id": run}]
    lineage = [r["run_id"] for r in doc(dsn, "lineage", retried["run_id"])]
    assert lineage[0] == run and set(lineage) == {
        run,
        retried["run_id"],
        repaired["run_id"],
        corrected["run_id"],
        undo["run_id"],
    }
    assert doc(dsn, "status", run)["state"] == "failed"  # the original stays as it was

    permanent = submitted(dsn, tmp_path, n=1)
    doc(dsn, "fail", permanent, "--reason", "manifest is wrong", "--permanent")
    before = snapshot(dsn)
    assert_refused(cli(dsn, "retry", permanent), "IllegalTransition", "transient")
    assert snapshot(dsn) == before


def test_reconcile(dsn: str, tmp_path: Path) -> None:
    report = doc(dsn, "reconcile")
    assert set(report) >= {"expired_leases", "finished_cancels", "finished_pauses", "failed_runs"}
    assert "reconciled:" in ok(dsn, "reconcile").stdout


def test_commands_the_core_does_not_support_yet_fail_cleanly(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_yet(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    monkeypatch.setattr(Ledger, "verify", not_yet)
    assert_refused(cli(dsn, "verify"), "NotImplementedError", "not support")


def test_verify_exits_1_when_it_finds_problems(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger import VerifyReport

    problem = {"kind": "hash_chain", "run_id": "r-1", "position": 7, "detail": "edited"}
    monkeypatch.setattr(
        Ledger,
        "verify",
        lambda self, progress=None, **checks: VerifyReport(ok=False, problems=[problem], events=9),
    )
    human = cli(dsn, "verify")
    assert human.exit_code == 1 and "1 problem(s)" in human.stdout and "hash_chain" in human.stdout
    as_json = cli(dsn, "verify", "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["problems"] == [problem]


def _core_has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_verify_and_rebuild(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    ok(dsn, "start", run)
    if not _core_has("ledger.projections.verify"):
        assert_refused(cli(dsn, "verify"), "NotImplementedError", "verify")
    else:
        report = doc(dsn, "verify")
        assert report["ok"] is True and report["problems"] == []
        checked = ok(dsn, "verify")
        assert "ok" in checked.stdout
        assert "verify: checking the hash chains" in checked.stderr
        assert "verify:" not in ok(dsn, "verify", "--no-progress").stderr
        assert f"heads {report['heads']}" in ok(dsn, "verify", "--heads").stdout.splitlines()
    before = snapshot(dsn)
    if not _core_has("ledger.projections.rebuild"):
        assert_refused(cli(dsn, "projections", "rebuild"), "NotImplementedError", "rebuild")
    else:
        sums = doc(dsn, "projections", "checksums")
        assert set(sums) == {
            "lg_runs",
            "lg_items",
            "lg_attempts",
            "lg_run_counts",
        }
        assert sums["lg_items"].startswith("2:")
        assert "lg_items" in ok(dsn, "projections", "checksums").stdout
        result = ok(dsn, "projections", "rebuild")
        assert (
            doc(dsn, "projections", "checksums") == sums
        )  # the rebuilt tables equal the live ones
        assert "projections rebuilt from" in result.stdout
        assert "rebuilding projections:" in result.stderr
        assert "events (100%)" in result.stderr.splitlines()[-1]
        assert "rebuilding" not in ok(dsn, "projections", "rebuild", "--no-progress").stderr
    assert snapshot(dsn) == before


def test_rebuild_progress_lines_show_done_total_rate_and_eta() -> None:
    from ledger.cli.entry import RebuildProgress

    now = [100.0]
    lines: list[str] = []
    progress = RebuildProgress(write=lines.append, interval=2.0, clock=lambda: now[0])
    progress(4_000, 20_000)  # resumed: 4,000 events were done by a crashed rebuild
    now[0] += 1.0
    progress(5_000, 20_000)  # within the interval: not shown
    now[0] += 1.0
    progress(6_000, 20_000)
    now[0] += 6.0
    progress(20_000, 20_000)
    progress(20_000, 20_000)  # the switch's report, nothing new: not repeated
    assert lines == [
        "rebuilding projections: 4,000/20,000 events (20%)",
        "rebuilding projections: 6,000/20,000 events (30%), 1,000 events/s, ETA 14s",
        "rebuilding projections: 20,000/20,000 events (100%), 2,000 events/s",
    ]


def test_verify_progress_lines_name_each_stage() -> None:
    from ledger.cli.entry import VerifyProgress

    now = [0.0]
    lines: list[str] = []
    progress = VerifyProgress(lines.append, interval=5.0, clock=lambda: now[0])
    progress("replay", 0, 9_000)
    now[0] += 3.0
    progress("replay", 2_000, 9_000)  # within the interval: not shown
    now[0] += 3.0
    progress("replay", 6_000, 9_000)
    progress("replay", 9_000, 9_000)
    progress("compare", 9_000, 9_000)
    progress("chains", 9_000, 9_000)
    assert lines == [
        "verify: replayed 0/9,000 events (0%)",
        "verify: replayed 6,000/9,000 events (67%), 1,000 events/s, ETA 3.0s",
        "verify: replayed 9,000/9,000 events (100%), 1,500 events/s",
        "verify: comparing the live projections with the replay",
        "verify: checking the hash chains",
    ]


def test_status_at_a_past_time(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    ok(dsn, "start", run)
    submit, start = doc(dsn, "history", run)[:2]
    if not _core_has("ledger.reads.timetravel"):
        assert_refused(
            cli(dsn, "status", run, "--at", submit["at"]), "NotImplementedError", "status --at"
        )
        return
    assert doc(dsn, "status", run, "--at", submit["at"])["state"] == "queued"
    assert doc(dsn, "status", run, "--at", start["at"])["state"] == "running"


# -- the real console script and start-up cost -----------------------------------


def test_the_process_entry_point(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    command = [sys.executable, "-m", "ledger.cli.entry"]
    if shutil.which("ledger"):
        command = [shutil.which("ledger") or "ledger"]
    done = subprocess.run(
        [*command, "--dsn", dsn, "status", run, "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run_id"] == run
    missing = subprocess.run(
        [*command, "--dsn", dsn, "status", str(uuid.uuid4())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: RunNotFound: ") and missing.stderr.count("\n") == 1
    usage = subprocess.run(
        [*command, "nonsense"], check=False, capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 2


def test_status_json_imports_only_what_it_needs(dsn: str, tmp_path: Path) -> None:
    run = submitted(dsn, tmp_path)
    code = (
        "import sys\n"
        "from ledger.cli import main\n"
        "heavy = ('rich', 'fastapi', 'uvicorn', 'ledger.worker.worker', 'ledger.cli.demo')\n"
        "assert not [m for m in sys.modules if m.startswith(heavy)], 'at import'\n"
        f"rc = main(['--dsn', {dsn!r}, 'status', {run!r}, '--json'])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy)\n"
        "print(rc, loaded, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "0 []"


def test_an_idempotency_key_makes_a_repeated_command_answer_from_the_record(
    dsn: str, tmp_path: Path
) -> None:
    m = write_json(tmp_path / "m.json", manifest(2))
    first = json.loads(
        ok(dsn, "--idempotency-key", "nightly-2026-11-29", "submit", m, "--json").stdout
    )
    again = json.loads(
        ok(dsn, "submit", m, "--json", "--idempotency-key", "nightly-2026-11-29").stdout
    )
    assert again == first
    assert [r["run_id"] for r in doc(dsn, "runs")] == [first["run_id"]]
    before = snapshot(dsn)
    # another command, or other arguments, under the same key: refused, nothing written
    assert_refused(
        cli(dsn, "--idempotency-key", "nightly-2026-11-29", "start", first["run_id"]),
        "InvalidInput",
        "idempotency_key",
    )
    assert_refused(
        cli(
            dsn,
            "--idempotency-key",
            "nightly-2026-11-29",
            "submit",
            write_json(tmp_path / "m3.json", manifest(3)),
        ),
        "InvalidInput",
    )
    # where one invocation makes many commands, the key does not apply: bad usage (exit 2),
    # refused before anything is done
    for many in (
        cli(dsn, "--idempotency-key", "w-1", "work", first["run_id"], "--handler", "json:dumps"),
        cli(dsn, "--idempotency-key", "r-1", "reconcile", "--watch", "1"),
    ):
        assert many.exit_code == 2 and "one command" in many.stderr, many.stderr
    assert_refused(cli(dsn, "--idempotency-key", "\n", "start", first["run_id"]), "InvalidInput")
    assert snapshot(dsn) == before


def test_keys_prune(dsn: str, tmp_path: Path) -> None:
    m = write_json(tmp_path / "m.json", manifest(1))
    first = json.loads(ok(dsn, "--idempotency-key", "k-1", "submit", m, "--json").stdout)
    assert json.loads(ok(dsn, "keys", "prune", "--older-than", "1", "--json").stdout) == {
        "removed": 0
    }
    assert (
        "1 idempotency key(s) older than 0 day(s) forgotten"
        in ok(dsn, "keys", "prune", "--older-than", "0").stdout
    )
    again = json.loads(ok(dsn, "--idempotency-key", "k-1", "submit", m, "--json").stdout)
    assert again["run_id"] != first["run_id"]  # forgotten: a new command
    keyed = cli(dsn, "--idempotency-key", "k-2", "keys", "prune", "--older-than", "1")
    assert keyed.exit_code == 2 and "--idempotency-key" in keyed.stderr
    for bad in ("-1", "abc", "nan", "inf", "1e308"):
        assert cli(dsn, "keys", "prune", "--older-than", bad).exit_code == 2, bad
