"""The tree outlives archive and moves with the log: archiving removes events but not
their leaves (an old checkpoint still verifies, an archived event is still provable), a
restored event must hash to its leaf, and `copy` and export/import give the same tree and
root on SQLite and PostgreSQL. `prove --run` gives a run's events with their proofs,
checked offline against a signed checkpoint."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ledger import Ledger
from ledger.core.note import Signer
from ledger.service import checkpoints as C
from ledger.service.copy import copy_ledger
from ledger.stores import tree as T
from ledger.transfer.history_file import ImportRefused
from tests.support.cli import cli
from tests.support.runs import OPERATOR, finished_run


@pytest.fixture
def key() -> Signer:
    return Signer.generate("tree.test")


def _positions_of(lg: Ledger, run_id: str) -> list[int]:
    return [e["position"] for e in C.run_proof(lg, run_id)["events"]]


def test_archive_keeps_the_tree_and_restore_checks_each_event_against_its_leaf(
    lg: Ledger, key: Signer, tmp_path: Path
) -> None:
    vkey = key.verifier().text()
    gone, kept = finished_run(lg, 2), finished_run(lg, 1)
    archived_positions = _positions_of(lg, gone)
    cp = C.sign(lg, key.text())
    size = C.tree_head(lg).size
    with lg.store.read() as tx:
        leaves = T.leaves_at(tx, archived_positions)
    indexes = [leaves[p][0] for p in archived_positions]

    lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[gone])
    report = lg.verify(checkpoints=[cp], vkeys=[vkey])
    assert report.ok, report.problems  # the old checkpoint still verifies
    for i in indexes:  # each archived event is still provable against it
        assert C.check_proof(C.inclusion(lg, i, size), [cp], [vkey])["ok"]
    later = C.sign(lg, key.text())  # the Archived event is a new leaf
    assert lg.verify(checkpoints=[cp, later], vkeys=[vkey]).ok
    assert C.check_proof(C.run_proof(lg, kept, size), [cp], [vkey])["ok"]

    lg.restore(OPERATOR, tmp_path / "a.jsonl")
    assert lg.verify(checkpoints=[cp, later], vkeys=[vkey]).ok
    assert _positions_of(lg, gone) == archived_positions

    # an event restored that does not hash to its leaf is refused, writing nothing
    lg.archive(OPERATOR, tmp_path / "b.jsonl", runs=[gone])
    with lg.store.write() as tx:
        tx.execute(
            "UPDATE lg_merkle_leaves SET data = ? WHERE leaf_index = ?", (b"\x07" * 32, indexes[0])
        )
    with pytest.raises(ImportRefused, match="does not hash to its leaf"):
        lg.restore(OPERATOR, tmp_path / "b.jsonl")
    assert lg.archived(gone) is not None


def test_deleting_events_behind_the_ledgers_back_is_not_an_archive(lg: Ledger, key: Signer) -> None:
    from tests.service.test_checkpoints import delete_newest

    finished_run(lg, 1)
    cp = C.sign(lg, key.text())
    delete_newest(lg, 1)  # the leaf stays, but not marked gone: verify sees it missing
    lg.rebuild_projections()
    report = lg.verify(checkpoints=[cp], vkeys=[key.verifier().text()])
    assert "checkpoint_truncated" in {p["kind"] for p in report.problems}


def test_a_run_proof_checks_offline_and_a_changed_event_does_not(lg: Ledger, key: Signer) -> None:
    vkey = key.verifier().text()
    run_id = finished_run(lg, 2)
    cp = C.sign(lg, key.text())
    doc = C.run_proof(lg, run_id)
    assert len(doc["events"]) > 4 and doc["not_in_tree"] == []
    assert {e["stream"] for e in doc["events"]} > {doc["events"][0]["stream"]}  # items too
    assert C.check_proof(json.dumps(doc), [cp], [vkey])["ok"]
    doc["events"][1]["hash"] = "00" * 32  # not the event that was signed
    assert not C.check_proof(doc, [cp], [vkey])["ok"]
    newer = finished_run(lg, 1)
    old = C.run_proof(lg, newer, int(cp.split("\n")[1]))
    assert old["events"] == [] and old["not_in_tree"]


def test_the_cli_proves_a_run_against_a_checkpoint(dsn: str, tmp_path: Path) -> None:
    with Ledger.open(dsn) as lg:
        run_id = finished_run(lg, 1)
    keys, cp = tmp_path / "keys", tmp_path / "cp"
    assert cli(dsn, "checkpoint", "keygen", "host", "--out", str(keys)).exit_code == 0
    r = cli(dsn, "checkpoint", "sign", "--key", str(keys / "host.key"), "--out", str(cp))
    assert r.exit_code == 0, r.output
    r = cli(dsn, "checkpoint", "prove", "--run", run_id[:8], "--checkpoint", str(cp))
    assert r.exit_code == 0, r.output
    (tmp_path / "run.json").write_text(r.stdout)
    assert json.loads(r.stdout)["run_id"] == run_id
    r = cli(
        dsn,
        "checkpoint",
        "check-proof",
        str(tmp_path / "run.json"),
        "--checkpoint",
        str(cp),
        "--vkey",
        str(keys / "host.vkey"),
    )
    assert r.exit_code == 0 and r.stdout.startswith("ok "), r.output


def _root(dsn: str) -> tuple[int, bytes]:
    with Ledger.open(dsn) as lg:
        head = C.tree_head(lg)
    return head.size, head.root


def test_copy_and_export_import_give_the_same_root(dsn: str, tmp_path: Path) -> None:
    with Ledger.open(dsn) as lg:
        finished_run(lg, 2)
        finished_run(lg, 1)
        spool = io.StringIO()
        lg.export(spool)
    source = _root(dsn)
    target = f"sqlite:///{tmp_path}/copy.db"
    copy_ledger(dsn, target)
    assert _root(target) == source
    spool.seek(0)
    imported = f"sqlite:///{tmp_path}/imported.db"
    with Ledger.open(imported) as lg:
        lg.import_file(spool)
    assert _root(imported) == source


@pytest.mark.postgres
def test_a_copy_to_postgres_gives_the_same_root(pg_dsn: str, tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path}/src.db"
    with Ledger.open(source) as lg:
        finished_run(lg, 2)
    copy_ledger(source, pg_dsn)
    assert _root(pg_dsn) == _root(source)
