"""Signed checkpoints (ledger/service/checkpoints.py) against whoever controls the database:
a rewrite with every later hash recomputed, a replaced ledger, deleted newest events, an
edited checkpoint and one signed by another key are each refused by `verify` with
checkpoints, naming the problem; an untouched and a grown ledger pass. The attacker works
with plain SQL behind the ledger's back and rebuilds the projections, so `verify` without
checkpoints says ok."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import pytest

from ledger import Ledger
from ledger.core import merkle as M
from ledger.core.note import Signer
from ledger.service import checkpoints as C
from ledger.stores.hashchain import GENESIS, HASH_COLUMN, event_hash, oid_param
from ledger.stores.raw import RawEvent, append_raw, read_stream_events
from tests.projections.test_verify import edit_event, sql_events
from tests.support.runs import finished_run


def kinds(report: Any) -> set[str]:
    return {p["kind"] for p in report.problems}


@pytest.fixture
def key() -> Signer:
    return Signer.generate("ledger.test")


def signed(lg: Ledger, key: Signer) -> str:
    return C.sign(lg, key.text(), origin="run-ledger/test")


def check(lg: Ledger, cp: str, key: Signer) -> Any:
    return lg.verify(checkpoints=[cp], vkeys=[key.verifier().text()])


def rechain(lg: Ledger, stream: uuid.UUID) -> None:
    """Recompute every hash of one stream from its stored bytes, as an attacker would."""
    table, _pos = sql_events(lg)
    with lg.store.write() as tx:
        prev = GENESIS
        for e in read_stream_events(tx, stream):
            hx = event_hash(prev, stream, e.version, e.topic, e.state)
            tx.execute(
                f"UPDATE {table} SET {HASH_COLUMN} = ? WHERE originator_id = ? AND originator_version = ?",  # noqa: S608 (our own table/column names; values are bound parameters)
                (hx, oid_param(lg.store.dialect, stream), e.version),
            )
            prev = hx


def delete_newest(lg: Ledger, n: int) -> None:
    table, pos = sql_events(lg)
    with lg.store.write() as tx:
        rows = tx.fetchall(f"SELECT {pos} AS p FROM {table} ORDER BY {pos} DESC LIMIT ?", (n,))  # noqa: S608 (our own table/column names; values are bound parameters)
        for r in rows:
            tx.execute(f"DELETE FROM {table} WHERE {pos} = ?", (r["p"],))  # noqa: S608 (our own table/column names; values are bound parameters)


def test_an_untouched_and_a_grown_ledger_pass(lg: Ledger, key: Signer) -> None:
    finished_run(lg)
    cp = signed(lg, key)
    assert check(lg, cp, key).ok
    finished_run(lg, 2)
    later = signed(lg, key)
    report = lg.verify(checkpoints=[cp, later], vkeys=[key.verifier().text()])
    assert report.ok, report.problems
    # the consistency proof from the first checkpoint to the second checks offline
    old = C.Checkpoint.parse(cp.split("\n\n")[0] + "\n")
    new = C.Checkpoint.parse(later.split("\n\n")[0] + "\n")
    proof = C.consistency(lg, old.size, new.size)
    assert C.check_proof(proof, [cp, later], [key.verifier().text()])["ok"]
    inc = C.inclusion(lg, 3, new.size)
    assert C.check_proof(json.dumps(inc), [later], [key.verifier().text()])["ok"]


def test_a_rewritten_event_with_every_later_hash_recomputed_is_refused(
    lg: Ledger, key: Signer
) -> None:
    run_id = finished_run(lg)
    cp = signed(lg, key)
    first = next(t for t in lg.history(run_id) if t.command == "submit").position
    edit_event(lg, first, lambda b: b.replace(b'"scope":"test"', b'"scope":"tset"'))
    with lg.store.read() as tx:
        row = tx.fetchone(
            f"SELECT originator_id AS oid FROM {sql_events(lg)[0]} WHERE {sql_events(lg)[1]} = ?",  # noqa: S608 (our own table/column names; values are bound parameters)
            (first,),
        )
    assert row is not None
    oid = row["oid"] if isinstance(row["oid"], uuid.UUID) else uuid.UUID(str(row["oid"]))
    rechain(lg, oid)
    lg.rebuild_projections()
    plain = lg.verify()
    assert plain.ok, plain.problems  # the hash chains alone cannot tell
    report = check(lg, cp, key)
    assert not report.ok and kinds(report) == {"checkpoint_rewritten"}
    assert "rewritten" in report.problems[0]["detail"]


def test_a_replaced_ledger_is_refused(lg: Ledger, key: Signer) -> None:
    finished_run(lg)
    cp = signed(lg, key)
    table, _pos = sql_events(lg)
    with lg.store.write() as tx:
        tx.execute(f"DELETE FROM {table}")  # noqa: S608 (our own table name)
    lg.rebuild_projections()
    finished_run(lg)  # another history of the same length
    assert lg.verify().ok
    report = check(lg, cp, key)
    assert kinds(report) == {"checkpoint_rewritten"}


def test_deleted_newest_events_are_refused(lg: Ledger, key: Signer) -> None:
    finished_run(lg)
    cp = signed(lg, key)
    delete_newest(lg, 2)
    lg.rebuild_projections()
    report = check(lg, cp, key)
    assert "checkpoint_truncated" in kinds(report)
    assert not (kinds(report) - {"checkpoint_truncated", "success_unearned"})


def test_an_edited_checkpoint_and_another_key_are_refused(lg: Ledger, key: Signer) -> None:
    finished_run(lg)
    cp = signed(lg, key)
    body, sigs = cp.split("\n\n")
    lines = body.split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    edited = "\n".join(lines) + "\n\n" + sigs
    assert kinds(check(lg, edited, key)) == {"checkpoint_forged"}
    other = Signer.generate("ledger.test")
    report = lg.verify(checkpoints=[C.sign(lg, other.text())], vkeys=[key.verifier().text()])
    assert kinds(report) == {"checkpoint_unknown_key"}
    # a checkpoint over more events than the ledger has, signed by the right key
    bigger = C.sign_checkpoint(C.Checkpoint("run-ledger/test", 10_000, bytes(32)), key)
    assert kinds(check(lg, bigger, key)) == {"checkpoint_truncated"}


def test_a_root_over_many_events_is_one_pass(tmp_path: Any) -> None:
    """Measured, not asserted: the root over 100,000 events on SQLite (printed with -s)."""
    lg = Ledger.open(f"sqlite:///{tmp_path}/big.db")
    try:
        n = 100_000
        events = [
            RawEvent(i + 1, uuid.UUID(int=i + 1), 1, "t", b"{}", f"{i:064x}") for i in range(n)
        ]
        with lg.store.write() as tx:
            append_raw(tx, events, keep_positions=True)
        start = time.perf_counter()
        head = C.tree_head(lg)
        took = time.perf_counter() - start
        print(f"\nMerkle root over {n} events on SQLite: {took:.2f} s")
        assert head.size == n
        assert head.root == M.root([M.leaf_hash(bytes.fromhex(e.hash or "")) for e in events])
    finally:
        lg.close()


def test_the_cli_signs_proves_and_catches_a_truncation(tmp_path: Any) -> None:
    from tests.support.cli import cli

    dsn = f"sqlite:///{tmp_path}/l.db"
    lg = Ledger.open(dsn)
    try:
        finished_run(lg)
    finally:
        lg.close()
    keys, cp = tmp_path / "keys", tmp_path / "cp"
    assert cli(dsn, "checkpoint", "keygen", "host", "--out", str(keys)).exit_code == 0
    assert (keys / "host.key").stat().st_mode & 0o777 == 0o600
    r = cli(dsn, "checkpoint", "sign", "--key", str(keys / "host.key"), "--out", str(cp))
    assert r.exit_code == 0, r.output
    vkey = str(keys / "host.vkey")
    r = cli(dsn, "verify", "--no-progress", "--checkpoint", str(cp), "--vkey", vkey)
    assert r.exit_code == 0, r.output
    size = cp.read_text().split("\n")[1]
    r = cli(dsn, "checkpoint", "prove", "--index", "2", "--size", size)
    assert r.exit_code == 0, r.output
    (tmp_path / "p.json").write_text(r.stdout)
    r = cli(
        dsn,
        "checkpoint",
        "check-proof",
        str(tmp_path / "p.json"),
        "--checkpoint",
        str(cp),
        "--vkey",
        vkey,
    )
    assert r.exit_code == 0 and r.stdout.startswith("ok "), r.output
    lg = Ledger.open(dsn)
    try:
        delete_newest(lg, 1)
        lg.rebuild_projections()
    finally:
        lg.close()
    r = cli(dsn, "verify", "--no-progress", "--json", "--checkpoint", str(cp), "--vkey", vkey)
    assert r.exit_code == 1
    assert "checkpoint_truncated" in {p["kind"] for p in json.loads(r.stdout)["problems"]}
