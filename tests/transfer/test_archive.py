"""Verifiable archival: events leave the store only into a verified archive,
recorded in the chain by one Archived event per run; restore brings back exactly the
events that left; a crash (SIGKILL) at any point never loses an event."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger import Actor, Ledger
from ledger.core.errors import IllegalTransition, InvalidInput, NotAuthorized
from ledger.projections.checksums import checksums
from ledger.stores.raw import max_position, read_raw
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

ROOT = Path(__file__).resolve().parents[2]


def _finished_runs(lg: Ledger, n: int = 3) -> list[str]:
    """n terminal runs (succeeded, canceled, and a repair linked to a failed one), then one
    running run that must never be archived."""
    done = []
    for k in range(n):
        run = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        if k == 1:
            lg.cancel(run, OPERATOR, "not needed")
        else:
            for lease in lg.claim(run, WORKER, limit=3):
                lg.accept(lease, evidence={"k": k})
            lg.complete(run, CONTROLLER)
        done.append(run)
    failed = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(failed, CONTROLLER)
    lg.fail(failed, CONTROLLER, "upstream down", transient=True)
    repair = lg.retry(failed, OPERATOR).run_id
    lg.start(repair, CONTROLLER)
    lg.fail(repair, OPERATOR, "give up", transient=True)
    return [*done, failed, repair]


def _snapshot(lg: Ledger) -> tuple[str, dict[str, str]]:
    report = lg.verify()
    assert report.ok, report.problems[:5]
    with lg.store.read() as tx:
        return report.heads, checksums(tx)


def _all_events(lg: Ledger) -> set[tuple[Any, int, str | None]]:
    with lg.store.read() as tx:
        return {(e.stream, e.version, e.hash) for e in read_raw(tx, 0, 10**9)}


def test_archive_then_restore_on_every_store(lg: Ledger, clock: Any, tmp_path: Path) -> None:
    runs = _finished_runs(lg)
    statuses = {r: lg.status(r) for r in runs}
    clock.advance(3600)
    open_run = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(open_run, CONTROLLER)
    before = _snapshot(lg)
    events = _all_events(lg)
    path = tmp_path / "archive.jsonl"

    summary = lg.archive(OPERATOR, path, terminal_before=clock() - timedelta(minutes=30))
    assert sorted(summary.runs) == sorted(runs)
    report = lg.verify()
    assert report.ok, report.problems[:5]
    assert {a["run_id"] for a in report.archived} == set(runs)
    assert {a["archive"] for a in report.archived} == {str(path)}
    assert report.heads != before[0]
    for r in runs:  # reads keep the final state, counts and links, and say where it went
        st = lg.status(r)
        old = statuses[r]
        assert (st.state, st.counts, st.links, st.failure_reason) == (
            old.state,
            old.counts,
            old.links,
            old.failure_reason,
        )
        assert st.summary.startswith("archived: ") and "archive.jsonl" in st.summary
        assert lg.history(r) == [] and lg.attempts(r) == []
        where = lg.archived(r)
        assert where is not None and where["archive"] == str(path)
    assert lg.status(open_run).state == "running"  # untouched
    left = _all_events(lg)
    assert len(left) == len(events) - summary.events + len(runs)  # one Archived event per run
    # projections are still disposable: a rebuild yields the same tables
    with lg.store.read() as tx:
        live = checksums(tx)
    lg.rebuild_projections()
    with lg.store.read() as tx:
        assert checksums(tx) == live
    # the same command again changes nothing
    again = lg.archive(OPERATOR, path, terminal_before=clock() - timedelta(minutes=30))
    assert (again.runs, again.events) == ([], 0)

    assert lg.archived(open_run) is None
    back = lg.restore(OPERATOR, path)
    assert sorted(back.runs) == sorted(runs)
    assert _snapshot(lg) == before  # same heads, same projections: the events that left
    assert _all_events(lg) == events
    assert lg.restore(OPERATOR, path).runs == []  # twice: a no-op


def test_restore_refuses_a_file_that_is_not_the_archive(
    lg: Ledger, clock: Any, tmp_path: Path
) -> None:
    runs = _finished_runs(lg, n=1)
    clock.advance(60)
    path = tmp_path / "a.jsonl"
    lg.archive(OPERATOR, path, runs=runs[:1])
    lines = path.read_text().splitlines(keepends=True)
    k = next(i for i, x in enumerate(lines) if '"actor_id' in json.loads(x).get("state", ""))
    doc = json.loads(lines[k])
    doc["state"] = doc["state"].replace('"actor_id":"', '"actor_id":"z', 1)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join([*lines[:k], json.dumps(doc) + "\n", *lines[k + 1 :]]))
    top = _all_events(lg)
    from ledger.transfer.imports import ImportRefused

    with pytest.raises(ImportRefused, match=f"position {doc['position']}"):
        lg.restore(OPERATOR, edited)
    # a valid file with other content (same runs, re-exported) is not the archive either
    other = tmp_path / "other.jsonl"
    other.write_text(path.read_text().replace("\n", "\n\n", 1))  # same events, other bytes
    with pytest.raises(ImportRefused, match="sha256"):
        lg.restore(OPERATOR, other)
    assert _all_events(lg) == top


def test_bad_archive_requests_are_refused_and_write_nothing(
    lg: Ledger, clock: Any, tmp_path: Path
) -> None:
    runs = _finished_runs(lg, n=1)
    running = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(running, CONTROLLER)
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "a.jsonl"
    events = _all_events(lg)
    with pytest.raises(InvalidInput, match="later than the store's clock"):
        lg.archive(OPERATOR, path, terminal_before=clock() + timedelta(days=1))
    with pytest.raises(IllegalTransition, match="only terminal runs") as info:
        lg.archive(OPERATOR, path, runs=[runs[0], running])
    assert info.value.state == "running"
    with pytest.raises(NotAuthorized):
        lg.archive(Actor("sam", "submitter"), path, terminal_before=clock())
    with pytest.raises(NotAuthorized):
        lg.restore(Actor("w", "worker"), path)
    with pytest.raises(InvalidInput, match="not before"):
        lg.archive(OPERATOR, path, runs=[runs[0]], terminal_before=clock() - timedelta(days=1))
    assert _all_events(lg) == events
    assert not list(path.parent.iterdir())  # no archive, not even a partial one


_ARCHIVER = """
import os, signal, sys
from datetime import datetime
from ledger import Actor, Ledger
from ledger.transfer.archive import archive

kill_at = int(sys.argv[3])
seen = 0
def checkpoint(point):
    global seen
    seen += 1
    print(point, flush=True)
    if seen == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

with Ledger.open(sys.argv[1]) as lg:
    archive(lg, Actor("ops", "operator"), sys.argv[2], terminal_before=datetime.fromisoformat(sys.argv[4]),
            checkpoint=checkpoint, delete_batch=7)
"""


def _archiver(dsn: str, path: Path, kill_at: int, before: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _ARCHIVER, dsn, str(path), str(kill_at), before],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.slow
def test_sigkill_of_the_archiver_at_random_points_never_loses_an_event(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    with Ledger.open(f"sqlite:///{base}/ledger.db") as lg:
        runs = _finished_runs(lg, n=3)
        before = _snapshot(lg)
        events = _all_events(lg)
        with lg.store.read() as tx:
            cutoff = tx.now().isoformat()
    # how many checkpoints a whole archive passes
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    done = _archiver(f"sqlite:///{probe}/ledger.db", probe / "a.jsonl", 0, cutoff)
    assert done.returncode == 0, done.stderr
    points = done.stdout.split()
    assert {"exporting", "renamed", "archived", "deleted"} <= set(points)
    rng = random.Random(18)
    for attempt, kill_at in enumerate(rng.sample(range(1, len(points) + 1), 10)):
        where = tmp_path / f"crash{attempt}"
        shutil.copytree(base, where)
        dsn, path = f"sqlite:///{where}/ledger.db", where / "a.jsonl"
        crashed = _archiver(dsn, path, kill_at, cutoff)
        assert crashed.returncode == -signal.SIGKILL, (kill_at, crashed.stderr)
        with Ledger.open(dsn) as lg:
            # never neither: every event is in the store, or in the verified archive with
            # its run's Archived event in the store
            report = lg.verify()
            assert report.ok, (points[kill_at - 1], report.problems[:3])
            archived = {a["run_id"] for a in report.archived}
            stored = _all_events(lg)
            in_file = _file_events(path) if archived else set()
            for event in events:
                assert event in stored or event in in_file, (points[kill_at - 1], event)
        restarted = _archiver(dsn, path, 0, cutoff)
        assert restarted.returncode == 0, restarted.stderr
        with Ledger.open(dsn) as lg:
            report = lg.verify()
            assert report.ok and {a["run_id"] for a in report.archived} == set(runs)
            assert len(_all_events(lg)) == len(events) - (len(_file_events(path))) + len(runs)
            lg.restore(OPERATOR, path)
            assert _snapshot(lg) == before
            assert _all_events(lg) == events


def _file_events(path: Path) -> set[tuple[Any, int, str | None]]:
    from uuid import UUID

    out = set()
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        if "end" not in doc:
            out.add((UUID(doc["stream"]), doc["version"], doc["hash"]))
    return out


def test_cli_archive_and_restore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ledger.cli.entry import main

    dsn = f"sqlite:///{tmp_path}/l.db"
    with Ledger.open(dsn) as lg:
        _finished_runs(lg, n=1)
        heads = _snapshot(lg)[0]
    path = tmp_path / "a.jsonl"
    assert (
        main(
            ["--dsn", dsn, "archive", "--terminal-before", "2000-01-01", "--to", str(path), "--yes"]
        )
        == 0
    )
    assert not path.exists()  # nothing that old
    assert (
        main(
            ["--dsn", dsn, "archive", "--terminal-before", "2999-01-01", "--to", str(path), "--yes"]
        )
        == 1
    )
    assert (
        main(
            [
                "--dsn",
                dsn,
                "--as",
                "sam:submitter",
                "archive",
                "--terminal-before",
                "now",
                "--to",
                str(path),
                "--yes",
            ]
        )
        == 1
    )
    assert (
        main(["--dsn", dsn, "archive", "--terminal-before", "now", "--to", str(path), "--yes"]) == 0
    )
    assert path.exists()
    with Ledger.open(dsn) as lg:
        runs = [r.run_id for r in lg.runs()]
    assert main(["--dsn", dsn, "history", runs[0]]) == 0
    assert "is archived" in capsys.readouterr().err
    assert main(["--dsn", dsn, "verify", "--no-progress"]) == 0
    assert "archived: run" in capsys.readouterr().out
    assert main(["--dsn", dsn, "restore", str(path)]) == 0
    with Ledger.open(dsn) as lg:
        assert _snapshot(lg)[0] == heads
        with lg.store.read() as tx:
            assert max_position(tx) > 0


def test_linked_runs_of_an_archived_run_are_refused_until_it_is_restored(
    lg: Ledger, tmp_path: Path
) -> None:
    from ledger import RunArchived

    failed = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(failed, CONTROLLER)
    lg.fail(failed, CONTROLLER, "upstream down", transient=True)
    path = tmp_path / "a.jsonl"
    lg.archive(OPERATOR, path, runs=[failed])
    events = _all_events(lg)
    for attempt in (
        lambda: lg.retry(failed, OPERATOR),
        lambda: lg.repair(failed, OPERATOR),
        lambda: lg.compensate(failed, OPERATOR, "undo", items=["i0"]),
    ):
        with pytest.raises(RunArchived, match="restore") as info:
            attempt()
        assert info.value.archive == str(path) and info.value.state == "failed"
    assert _all_events(lg) == events
    lg.restore(OPERATOR, path)
    assert lg.retry(failed, OPERATOR).counts["pending"] == 2


@pytest.mark.slow
@pytest.mark.postgres
def test_sigkill_of_the_archiver_on_postgres_never_loses_an_event(
    pg_server: Any, pg_dsn: str, tmp_path: Path
) -> None:
    """The batched deletes in short transactions, killed between them (PostgreSQL)."""
    import secrets

    from tests.support.pgserver import create_database, drop_database

    with Ledger.open(pg_dsn) as lg:
        runs = _finished_runs(lg, n=3)
        before = _snapshot(lg)
        events = _all_events(lg)
        with lg.store.read() as tx:
            cutoff = tx.now().isoformat()
    base = pg_dsn.rsplit("/", 1)[1]

    def clone() -> tuple[str, str]:
        name = f"{base}_k{secrets.token_hex(3)}"
        create_database(pg_server.admin_dsn, name, template=base)
        return name, pg_server.dsn(name)

    name, probe = clone()
    try:
        done = _archiver(probe, tmp_path / "probe.jsonl", 0, cutoff)
        assert done.returncode == 0, done.stderr
        points = done.stdout.split()
    finally:
        drop_database(pg_server.admin_dsn, name)
    deletes = [i + 1 for i, p in enumerate(points) if p in ("archived", "deleted")]
    for attempt, kill_at in enumerate(random.Random(15).sample(deletes, min(4, len(deletes)))):
        name, dsn = clone()
        path = tmp_path / f"a{attempt}.jsonl"
        try:
            crashed = _archiver(dsn, path, kill_at, cutoff)
            assert crashed.returncode == -signal.SIGKILL, crashed.stderr
            with Ledger.open(dsn) as lg:
                report = lg.verify()
                assert report.ok, (points[kill_at - 1], report.problems[:3])
                stored, in_file = _all_events(lg), _file_events(path)
                assert all(e in stored or e in in_file for e in events)
            assert _archiver(dsn, path, 0, cutoff).returncode == 0
            with Ledger.open(dsn) as lg:
                assert {a["run_id"] for a in lg.verify().archived} == set(runs)
                lg.restore(OPERATOR, path)
                assert _snapshot(lg) == before
        finally:
            drop_database(pg_server.admin_dsn, name)
