"""`ledger demo`: every scenario ends as designed, a seed decides the outcome, reruns are safe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from ledger import Ledger
from ledger.cli.entry import app

runner = CliRunner()
ITEMS, WORKERS = 8, 3


def demo(dsn: str, seed: int) -> dict[str, Any]:
    result = runner.invoke(
        app,
        [
            "--dsn",
            dsn,
            "demo",
            "--items",
            str(ITEMS),
            "--workers",
            str(WORKERS),
            "--seed",
            str(seed),
            "--json",
        ],
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def outcome(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a seed must fix: states, counts, attempts and link relations per scenario."""
    return [
        (
            s["name"],
            s["state"],
            s["counts"],
            s["attempts"],
            [link["relation"] for link in s["links"]],
        )
        for s in data["scenarios"]
    ]


def test_each_scenario_ends_as_designed(dsn: str) -> None:
    data = demo(dsn, seed=11)
    by = {s["name"]: s for s in data["scenarios"]}
    assert list(by) == ["flaky", "review", "cancel", "partial", "repair"]

    flaky = by["flaky"]
    assert (flaky["state"], flaky["counts"]) == ("succeeded", {"accepted": ITEMS})
    assert flaky["attempts"] > ITEMS  # some items needed retries

    review = by["review"]
    assert (review["state"], review["counts"]) == ("succeeded", {"accepted": ITEMS + 1})
    assert any("StaleReview" in line for line in review["story"])

    cancel = by["cancel"]
    assert cancel["state"] == "canceled"
    assert cancel["counts"] == {"accepted": WORKERS, "skipped": ITEMS - WORKERS}
    assert cancel["attempts"] == WORKERS

    partial = by["partial"]
    assert partial["state"] == "completed_with_errors"
    assert partial["counts"]["accepted"] == ITEMS - 1 and partial["counts"]["quarantined"] == 1

    repair = by["repair"]
    assert (repair["state"], repair["counts"]) == ("succeeded", {"accepted": 1})
    assert repair["links"] == [{"relation": "repair_of", "run_id": partial["run_id"]}]
    assert {"relation": "repaired_by", "run_id": repair["run_id"]} in partial["links"]

    with Ledger.open(dsn) as lg:  # the store agrees with what the demo printed
        for s in data["scenarios"]:
            assert lg.status(s["run_id"]).state == s["state"]
        canceled = lg.items(cancel["run_id"], state="skipped")
        assert {i.reason for i in canceled} == {"canceled"}
        errors = [a.error or "" for a in lg.attempts(flaky["run_id"])]
        assert not any("hunter2" in e for e in errors)  # the simulated password was redacted


def per_item_attempts(dsn: str, data: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Which items needed how many attempts, per scenario: what the seed decides."""
    with Ledger.open(dsn) as lg:
        return {
            s["name"]: {i.item_id: i.attempts for i in lg.items(s["run_id"])}
            for s in data["scenarios"]
        }


def test_a_seed_fixes_the_outcome_and_reruns_on_one_file_are_safe(tmp_path: Path) -> None:
    one, two = f"sqlite:///{tmp_path}/one.db", f"sqlite:///{tmp_path}/two.db"
    first = demo(one, seed=5)
    again = demo(one, seed=5)  # same file: new runs, same outcome
    elsewhere = demo(two, seed=5)
    assert outcome(first) == outcome(again) == outcome(elsewhere)
    assert (
        per_item_attempts(one, first)
        == per_item_attempts(one, again)
        == per_item_attempts(two, elsewhere)
    )
    assert {s["run_id"] for s in first["scenarios"]}.isdisjoint(
        s["run_id"] for s in again["scenarios"]
    )
    with Ledger.open(one) as lg:
        assert len(lg.runs()) == 10
    # the seed, not chance, picks the flaky items: another seed picks others
    three = f"sqlite:///{tmp_path}/three.db"
    other = demo(three, seed=6)
    assert per_item_attempts(three, other)["flaky"] != per_item_attempts(one, first)["flaky"]


def test_human_output_names_real_runs_and_next_commands(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/demo.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ledger.cli.entry",
            "--dsn",
            dsn,
            "demo",
            "--items",
            "6",
            "--workers",
            "2",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    with Ledger.open(dsn) as lg:
        runs = lg.runs()
    assert len(runs) == 5
    for run in runs:
        assert run.run_id in out
    for phrase in (
        "StaleReview",
        "completed_with_errors",
        "repair_of",
        "Try next:",
        f"ledger --dsn {dsn} history",
        f"ledger --dsn {dsn} audit --run",
    ):
        assert phrase in out, phrase


def test_too_few_items_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--dsn", f"sqlite:///{tmp_path}/d.db", "demo", "--items", "3"])
    assert result.exit_code == 2
