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
from ledger.core.errors import InvalidInput
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
    r = cli(dsn, "checkpoint", "prove", "--index", "2", "--size", size, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["leaf_index"], doc["tree_size"]) == (2, int(size)) and doc["hashes"]
    (tmp_path / "p.json").write_text(r.stdout)
    # a proof file of the first release (index, size, proof) checks too
    (tmp_path / "old.json").write_text(json.dumps(_old_names(doc)))
    for name in ("p.json", "old.json"):
        r = cli(
            dsn,
            "checkpoint",
            "check-proof",
            str(tmp_path / name),
            "--checkpoint",
            str(cp),
            "--vkey",
            vkey,
        )
        assert r.exit_code == 0 and r.stdout.startswith("ok "), (name, r.output)
    r = cli(dsn, "checkpoint", "prove", "--from", "1", "--to", size, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["size1"], doc["size2"]) == (1, int(size)) and doc["hashes"]
    lg = Ledger.open(dsn)
    try:
        delete_newest(lg, 1)
        lg.rebuild_projections()
    finally:
        lg.close()
    r = cli(dsn, "verify", "--no-progress", "--json", "--checkpoint", str(cp), "--vkey", vkey)
    assert r.exit_code == 1
    assert "checkpoint_truncated" in {p["kind"] for p in json.loads(r.stdout)["problems"]}


def _old_names(doc: dict[str, Any]) -> dict[str, Any]:
    """A proof as the first release of `prove` wrote it: index, size, proof, from, to,
    from_root, to_root."""
    rename = {
        "leaf_index": "index",
        "tree_size": "size",
        "hashes": "proof",
        "size1": "from",
        "size2": "to",
        "root1": "from_root",
        "root2": "to_root",
    }
    out = {rename.get(k, k): v for k, v in doc.items()}
    if "events" in out:
        out["events"] = [_old_names(e) for e in out["events"]]
    return out


def test_proofs_have_the_rfc_shape_and_old_files_still_check(lg: Ledger, key: Signer) -> None:
    vkey = key.verifier().text()
    run_id = finished_run(lg)
    first = signed(lg, key)
    finished_run(lg, 1)
    second = signed(lg, key)
    size1 = C.Checkpoint.parse(first.split("\n\n")[0] + "\n").size
    size2 = C.Checkpoint.parse(second.split("\n\n")[0] + "\n").size

    inc = C.inclusion(lg, 2, size2)
    assert {"leaf_index", "tree_size", "hashes"} <= inc.keys()
    assert not {"index", "size", "proof"} & inc.keys()
    assert (inc["leaf_index"], inc["tree_size"]) == (2, size2)
    assert all(len(base64.b64decode(h)) == 32 for h in inc["hashes"]) and inc["hashes"]
    con = C.consistency(lg, size1, size2)
    assert {"size1", "size2", "hashes"} <= con.keys()
    assert not {"from", "to", "proof"} & con.keys()
    assert (con["size1"], con["size2"]) == (size1, size2) and con["hashes"]
    run = C.run_proof(lg, run_id, size1)
    assert run["tree_size"] == size1 and run["events"]
    assert all({"leaf_index", "hashes"} <= e.keys() for e in run["events"])
    assert not any({"index", "proof"} & e.keys() for e in run["events"])

    both = [first, second]
    for doc in (inc, con, run):
        assert C.check_proof(doc, both, [vkey])["ok"], doc["type"]
        # a file written with the first release's field names still checks
        old = _old_names(doc)
        assert C.check_proof(json.dumps(old), both, [vkey])["ok"], doc["type"]
    # and a wrong leaf index still fails, in either naming
    assert not C.check_proof({**inc, "leaf_index": 3}, both, [vkey])["ok"]
    assert not C.check_proof({**_old_names(inc), "index": 3}, both, [vkey])["ok"]
    # the bare shapes of the issue (no type; a consistency proof without its roots takes
    # the older root from a checkpoint of that size)
    bare_inc = {k: inc[k] for k in ("leaf_index", "tree_size", "hashes", "leaf_hash")}
    assert C.check_proof(bare_inc, both, [vkey])["ok"]
    bare_con = {k: con[k] for k in ("size1", "size2", "hashes")}
    assert C.check_proof(bare_con, both, [vkey])["ok"]
    wrong = [C.b64(bytes(32)), *con["hashes"][1:]]
    assert not C.check_proof({**bare_con, "hashes": wrong}, both, [vkey])["ok"]
    with pytest.raises(InvalidInput, match="root1"):  # no root and no checkpoint of size1
        C.check_proof({**bare_con, "size1": size1 - 1}, both, [vkey])
